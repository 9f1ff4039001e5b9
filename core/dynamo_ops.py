"""Torch-level ops of a Dynamo FX graph under one name each.

Before AOTAutograd an op has many spellings: ``q @ k`` is ``operator.matmul``, ``torch.matmul``,
``torch.bmm`` or the method ``q.matmul(k)``; a softmax is ``torch.softmax``, ``F.softmax`` or
``x.softmax`` with the ``dtype`` argument in a different position in each. :func:`canonical`
looks a node up in one table and returns a :class:`Call`: the canonical op name and the
node's arguments bound by parameter name, defaults filled in. Passes over Dynamo graphs
(``coil.attention``) match canonical names and never spell an op twice.

Also here: :func:`constant`, the value of an argument known when the graph compiles (a Python
number, or a 0-d tensor built in the graph from one); :func:`permutation`, the dims a
transposing op reorders; and what a pass needs to edit such a graph: :func:`has_effects`
(may a node mutate or switch a mode), :class:`Emitter` (new nodes with the fake values Dynamo
would have recorded) and :func:`erase_unused`."""
from __future__ import annotations

import builtins
import operator
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.fx
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.multiprocessing.reductions import StorageWeakRef

_FN = "call_function"
_METHOD = "call_method"


@dataclass(frozen=True)
class Call:
    """``node`` as the canonical op ``op``, its arguments bound by name in ``args``."""

    op: str
    args: Mapping[str, Any]
    node: torch.fx.Node

    def __getitem__(self, name: str) -> Any:
        return self.args.get(name)


@dataclass(frozen=True)
class _Spelling:
    op: str
    #: Positional parameter names; one starting with ``*`` takes the remaining positional
    #: arguments (a single tuple or list argument is unpacked, as ``x.view((2, 3))``).
    params: tuple[str, ...]
    defaults: tuple[tuple[str, Any], ...] = ()


_SPELLINGS: dict[tuple[str, Any], _Spelling] = {}


def _spell(op: str, params: tuple[str, ...], *, functions: tuple[Any, ...] = (),
           methods: tuple[str, ...] = (), defaults: Mapping[str, Any] | None = None) -> None:
    spelling = _Spelling(op, params, tuple((defaults or {}).items()))
    for fn in functions:
        _SPELLINGS[(_FN, fn)] = spelling
    for name in methods:
        _SPELLINGS[(_METHOD, name)] = spelling


_BINARY = ("input", "other")
_spell("matmul", _BINARY, functions=(torch.matmul, operator.matmul, torch.bmm),
       methods=("matmul", "bmm", "__matmul__"))
_spell("mul", _BINARY, functions=(torch.mul, torch.multiply, operator.mul),
       methods=("mul", "multiply", "__mul__", "__rmul__"))
_spell("div", _BINARY, functions=(torch.div, torch.divide, torch.true_divide, operator.truediv),
       methods=("div", "divide", "true_divide", "__truediv__"), defaults={"rounding_mode": None})
_spell("add", _BINARY, functions=(torch.add, operator.add), methods=("add", "__add__", "__radd__"),
       defaults={"alpha": 1})
_spell("sub", _BINARY, functions=(torch.sub, torch.subtract, operator.sub), methods=("sub", "subtract", "__sub__"),
       defaults={"alpha": 1})
# ``1.0 - x`` as Dynamo may record it: ``x.__rsub__(1.0)`` or ``torch.rsub(x, 1.0)``
_spell("sub", ("other", "input"), functions=(torch.rsub,), methods=("__rsub__",), defaults={"alpha": 1})
_spell("masked_fill", ("input", "mask", "value"), functions=(torch.masked_fill,),
       methods=("masked_fill",))
_spell("where", ("condition", "input", "other"), functions=(torch.where,))
_spell("where", ("input", "condition", "other"), methods=("where",))
_spell("softmax", ("input", "dim", "dtype"), functions=(torch.softmax, torch.special.softmax),
       methods=("softmax",))
_spell("softmax", ("input", "dim", "_stacklevel", "dtype"), functions=(F.softmax,))
_spell("dropout", ("input", "p", "training", "inplace"), functions=(F.dropout,),
       defaults={"p": 0.5, "training": True, "inplace": False})
_spell("dropout", ("input", "p", "training"), functions=(torch.dropout,))
# dtype conversions; what a call converts to is read from its result (cast_of)
_spell("cast", ("input", "*rest"),
       methods=("to", "type", "type_as", "float", "half", "bfloat16", "double", "bool", "int", "long"))
_spell("transpose", ("input", "dim0", "dim1"), functions=(torch.transpose, torch.swapaxes, torch.swapdims),
       methods=("transpose", "swapaxes", "swapdims"))
_spell("permute", ("input", "dims"), functions=(torch.permute,))
_spell("permute", ("input", "*dims"), methods=("permute",))
_spell("t", ("input",), functions=(torch.t,), methods=("t",))
_spell("getattr", ("input", "name"), functions=(builtins.getattr,))
_spell("logical_not", ("input",), functions=(torch.logical_not,), methods=("logical_not",))
_spell("bitwise_not", ("input",), functions=(torch.bitwise_not, operator.invert),
       methods=("bitwise_not", "__invert__"))
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _spell(_name, _BINARY, functions=(getattr(torch, _name), getattr(operator, _name)),
           methods=(_name, f"__{_name}__"))
# ops that only re-shape (the values at the last two dims' positions are what a mask pass reads)
_spell("reshape", ("input", "*rest"), functions=(torch.reshape, torch.unsqueeze, torch.squeeze, torch.clone),
       methods=("view", "reshape", "unsqueeze", "squeeze", "expand", "expand_as", "contiguous", "clone"))
_spell("getitem", ("input", "index"), functions=(operator.getitem,))
_spell("tril", ("input", "diagonal"), functions=(torch.tril,), methods=("tril",), defaults={"diagonal": 0})
_spell("triu", ("input", "diagonal"), functions=(torch.triu,), methods=("triu",), defaults={"diagonal": 0})
_spell("ones", ("*size",), functions=(torch.ones,))
_spell("ones", ("input",), functions=(torch.ones_like,))
_spell("full", ("size", "fill_value"), functions=(torch.full,))
_spell("zeros", ("*size",), functions=(torch.zeros,))
_spell("zeros", ("input",), functions=(torch.zeros_like,))
_spell("arange", ("*range",), functions=(torch.arange,))
_spell("tensor", ("data",), functions=(torch.tensor, torch.scalar_tensor))


def canonical(node: Any) -> Call | None:
    """``node`` as a :class:`Call`, or None for a node (or value) the table does not know."""
    if not isinstance(node, torch.fx.Node) or node.op not in (_FN, _METHOD):
        return None
    try:
        spelling = _SPELLINGS.get((node.op, node.target))
    except TypeError:  # an unhashable target
        return None
    if spelling is None:
        return None
    bound = dict(spelling.defaults)
    args = list(node.args)
    for i, param in enumerate(spelling.params):
        if param.startswith("*"):
            rest = args[i:]
            unpack = len(rest) == 1 and isinstance(rest[0], (tuple, list))
            bound[param[1:]] = tuple(rest[0]) if unpack else tuple(rest)
            args = []
            break
        if i < len(args):
            bound[param] = args[i]
    if len(args) > len(spelling.params):
        return None  # more positional arguments than the spelling has: not the op we think
    bound.update(node.kwargs)
    return Call(spelling.op, bound, node)


def value(arg: Any) -> Any:
    """What a node computed when Dynamo traced it (its fake tensor or symbolic number); a
    non-node argument is itself."""
    return arg.meta.get("example_value") if isinstance(arg, torch.fx.Node) else arg


def written(graph: torch.fx.Graph, nodes: set[torch.fx.Node]) -> bool:
    """Whether a node with effects (``mask[i] = False``, ``mask.masked_fill_(...)``) takes a
    tensor sharing memory with one of ``nodes`` (itself or a view of it)."""
    storages = {_storage(value(n)) for n in nodes} - {None}
    for node in graph.nodes:
        if has_effects(node) and node.op != "output" and any(
                _storage(value(a)) in storages for a in node.all_input_nodes):
            return True
    return False


def _storage(fake: Any) -> StorageWeakRef | None:
    return StorageWeakRef(fake.untyped_storage()) if isinstance(fake, torch.Tensor) else None


def constant(arg: Any) -> float | None:
    """The value of ``arg`` when it is known at compile time: a Python number, or a 0-d
    tensor the graph builds from one (``torch.tensor(8.0)``, ``torch.full([], -inf)``) and
    never writes in place,
    rounded to that tensor's dtype. None for anything else, tensors the graph receives
    (buffers, parameters) included: their values can change without a recompile."""
    if isinstance(arg, bool):
        return None
    if isinstance(arg, (int, float)):
        return float(arg)
    call = canonical(arg)
    fake = value(arg)
    if call is None or not isinstance(fake, torch.Tensor) or fake.dim() != 0:
        return None
    if any(has_effects(user) for user in arg.users):
        return None  # written in place after it was made (``t = torch.tensor(8.0); t.mul_(4)``)
    if call.op == "tensor":
        number = call["data"]
    elif call.op == "full" and tuple(call["size"] or ()) == ():
        number = call["fill_value"]
    else:
        return None
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        return None
    return float(torch.tensor(number, dtype=torch.float64).to(fake.dtype).item())


def permutation(call: Call) -> tuple[int, ...] | None:
    """The dims a transposing op takes its result's dims from (``permute``'s argument), or
    None when ``call`` does not only reorder dims."""
    fake = value(call["input"])
    if not isinstance(fake, torch.Tensor):
        return None
    ndim = fake.dim()
    dims = list(range(ndim))
    if call.op == "transpose":
        d0, d1 = call["dim0"], call["dim1"]
        if not (isinstance(d0, int) and isinstance(d1, int) and -ndim <= min(d0, d1) and max(d0, d1) < ndim):
            return None
        d0, d1 = d0 % ndim, d1 % ndim
        dims[d0], dims[d1] = dims[d1], dims[d0]
    elif call.op == "t" and ndim == 2:
        dims = [1, 0]
    elif call.op == "getattr" and call["name"] == "mT" and ndim >= 2:
        dims[-2], dims[-1] = dims[-1], dims[-2]
    elif call.op == "permute":
        given = call["dims"]
        if not all(isinstance(d, int) and -ndim <= d < ndim for d in given) or len(given) != ndim:
            return None
        dims = [d % ndim for d in given]
        if sorted(dims) != list(range(ndim)):
            return None
    else:
        return None
    return tuple(dims)


def same_shape(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes, decided without adding guards on symbolic sizes."""
    return a.dim() == b.dim() and all(statically_known_true(x == y) for x, y in zip(a.shape, b.shape))


# ----------------------------------------------------------------------------- editing

#: ``operator`` functions that update their first argument when it is a tensor.
_INPLACE_OPERATORS = {"iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand",
                      "ior", "ixor", "ilshift", "irshift", "imatmul", "setitem"}


def has_effects(node: torch.fx.Node) -> bool:
    """Whether ``node`` may mutate a tensor (an in-place method or operator, ``out=``) or
    switch a mode (autocast, grad mode: FX's side-effectful functions); a module call is
    opaque, so it may."""
    if node.op in ("call_module", "output"):
        return True
    if node.op not in ("call_function", "call_method"):
        return False
    if "out" in node.kwargs:
        return True
    if node.op == "call_function" and node.target in torch.fx.node._side_effectful_functions:
        return True
    if isinstance(node.target, torch._ops.OpOverload):  # torch.ops.* called directly
        return node.target._schema.is_mutable
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    if getattr(node.target, "__module__", None) in ("operator", "_operator"):
        return name in _INPLACE_OPERATORS  # operator.and_, or_, not_ return new values
    return name in _INPLACE_OPERATORS or (name.endswith("_") and not name.startswith("__"))


def erase_unused(graph: torch.fx.Graph, candidates: list[Any]) -> set[torch.fx.Node]:
    """Erase the nodes among ``candidates`` that nothing uses, then their inputs that this
    leaves unused, and so on (calls without effects only); returns the erased nodes."""
    pending = [n for n in candidates if isinstance(n, torch.fx.Node)]
    erased: set[torch.fx.Node] = set()
    while pending:
        node = pending.pop()
        if node in erased or node.users or node.op not in ("call_function", "call_method"):
            continue
        if has_effects(node):
            continue
        inputs = list(node.all_input_nodes)
        graph.erase_node(node)
        erased.add(node)
        pending.extend(inputs)
    return erased


class Emitter:
    """Adds nodes at the graph's insertion point for a pass that replaces ``replaced``: each
    with the fake value its op computes on its arguments' (``meta["example_value"]``, as
    Dynamo records it; an op that rejects its arguments raises here) and ``replaced``'s
    stack trace. :meth:`undo` erases what was added."""

    def __init__(self, graph: torch.fx.Graph, replaced: torch.fx.Node) -> None:
        self.graph = graph
        self.meta = {k: replaced.meta[k] for k in ("stack_trace", "nn_module_stack") if k in replaced.meta}
        self.fake_mode = value(replaced).fake_mode  # Dynamo's, which may not be the backend's
        self.added: list[torch.fx.Node] = []

    def function(self, target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        return self._add("call_function", target, args, kwargs, target)

    def method(self, name: str, *args: Any, **kwargs: Any) -> torch.fx.Node:
        return self._add("call_method", name, args, kwargs, lambda x, *a, **kw: getattr(x, name)(*a, **kw))

    def cast(self, node: Any, dtype: torch.dtype) -> Any:
        """``node.to(dtype)``, or ``node`` when it has that dtype."""
        return node if value(node).dtype == dtype else self.method("to", node, dtype)

    def _add(self, op: str, target: Any, args: tuple, kwargs: dict, fn: Any) -> torch.fx.Node:
        node = self.graph.create_node(op, target, args, kwargs)
        self.added.append(node)
        node.meta.update(self.meta)
        fake_args, fake_kwargs = torch.fx.node.map_arg((args, kwargs), value)
        with self.fake_mode:
            node.meta["example_value"] = fn(*fake_args, **fake_kwargs)
        return node

    def undo(self) -> None:
        for node in reversed(self.added):
            self.graph.erase_node(node)
