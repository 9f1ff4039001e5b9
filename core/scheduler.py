"""The scheduler: dead-code elimination, a dependency graph of IR nodes, greedy fusion into
kernels (vertical, reduction with producers and consumers, horizontal), and a topological
order of the resulting steps. The device's ``Scheduling`` (from its plugin) can veto a fusion
and bounds the kernel size; every refusal is recorded with its reason."""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import sympy
import torch

from . import collectives, config, ir
from .fusion_pairs import fusion_pairs, tiny
from .graph import LoweredGraph
from .loop_order import memory_order, permute
from .memory_order import MemoryView, deferrable
from . import templates
from .kernel import Kernel, KernelNode, Loop, TemplateCall
from .index_compare import simplify_comparison
from .rerange import merge_leading, mover, simplify_in
from .symbol_deps import symbol_definers, symbol_edges

log = logging.getLogger(__name__)

FUSABLE = (ir.PointwiseNode, ir.ReductionNode, ir.TemplateNode)


class FusionPolicy(Protocol):
    """What the core asks a device about fusion (``coil.sdk.Scheduling`` implements it)."""

    max_fusion_size: int

    def can_fuse(self, x_ranges: tuple, r_ranges: tuple, nodes: Sequence[ir.Node]) -> bool: ...


@dataclass
class Group:
    """Nodes that will become one kernel."""

    members: list[int]
    x: tuple
    r: tuple
    alive: bool = True


@dataclass
class FusionDecision:
    a: str
    b: str
    fused: bool
    reason: str


@dataclass
class Schedule:
    """Steps in execution order: each a Kernel or an ExternNode."""

    steps: list[object]
    decisions: list[FusionDecision] = field(default_factory=list)


def _node_group(node: ir.Node) -> tuple[tuple, tuple] | None:
    if isinstance(node, (ir.PointwiseNode, ir.TemplateNode)):
        return tuple(node.ranges), ()
    if isinstance(node, ir.ReductionNode):
        return tuple(node.ranges), tuple(node.reduction_ranges)
    return None


def _combine(a: tuple[tuple, tuple], b: tuple[tuple, tuple]) -> tuple[tuple, tuple] | None:
    """The iteration space of a kernel holding both, or None when they do not fit."""
    (xa, ra), (xb, rb) = a, b
    if ra and rb:
        return (xa, ra) if (xa, ra) == (xb, rb) else None
    if not ra and not rb:
        return a if xa == xb else None
    if not ra:
        (xa, ra), (xb, rb) = (xb, rb), (xa, ra)
    # (xa, ra) is the reduction space; xb is a pointwise space
    if xb == xa or xb == xa + ra:
        return xa, ra
    return None


#: Library calls run for their effect alone: a check that raises as eager does (one_hot's
#: class range, decompositions' ``_assert_async``); nothing reads what they return.
_CHECKS = frozenset({torch.ops.aten._assert_async.default, torch.ops.aten._assert_async.msg,
                     torch.ops.aten._assert_scalar.default})


def eliminate_dead(graph: LoweredGraph) -> list[ir.Node]:
    needed = {o.name for o in graph.outputs if o.name}
    for o in graph.outputs:
        if o.name and graph.buffers.get(o.name) and graph.buffers[o.name].storage:
            needed.add(o.name)
    kept: list[ir.Node] = []
    definers = symbol_definers(graph.nodes)
    for node in reversed(graph.nodes):
        # writes into their arguments: a generated one, or a library call's (the write-back
        # into a complex input falls back to ATen's copy_, which was dropped as dead: a
        # compiled optimizer step left complex parameters unchanged, a hunt, session 33)
        mutation = (isinstance(node, ir.PointwiseNode) and node.mutates) or (
            isinstance(node, ir.ExternNode) and getattr(getattr(node.op, "_schema", None), "is_mutable", False))
        check = isinstance(node, ir.ExternNode) and (node.op in _CHECKS or id(node) in definers)
        if mutation or check or any(out in needed for out in node.outputs()):
            kept.append(node)
            needed |= node.reads()
            if isinstance(node, ir.ExternNode):
                needed |= set(node.aliases)
    kept.reverse()
    return kept


class Scheduler:
    def __init__(self, graph: LoweredGraph, policies: dict[str, FusionPolicy],
                 max_fusion_size: int | None = None, freed_inputs: frozenset[str] = frozenset()) -> None:
        self.graph = graph
        #: Graph inputs whose memory the wrapper's ``del`` returns (a backward's saved values).
        self.freed_inputs = freed_inputs
        self.policies = policies
        #: The ``max_fusion_size`` knob; each device's own limit applies too (the smaller wins).
        self.max_fusion_size = (config.current().max_fusion_size if max_fusion_size is None
                                else max_fusion_size)
        self.nodes = eliminate_dead(graph)
        #: Buffers each node reads (walking a body is not free: computed once).
        self.reads = [node.reads() for node in self.nodes]
        self.decisions: list[FusionDecision] = []
        self._build_deps()

    # -- dependencies

    def _build_deps(self) -> None:
        writer: dict[str, int] = {}
        self.preds: list[set[int]] = [set() for _ in self.nodes]
        readers_of_old: dict[str, set[int]] = {}
        for i, reads in enumerate(self.reads):
            for name in reads:
                readers_of_old.setdefault(name, set()).add(i)
        for i, node in enumerate(self.nodes):
            for name in self.reads[i]:
                if name in writer:
                    self.preds[i].add(writer[name])
            if isinstance(node, ir.PointwiseNode) and node.mutates:
                # every node that reads the value before mutation (by the storage's own
                # name) runs first, wherever the lowering placed it
                self.preds[i] |= readers_of_old.get(node.mutates, set()) - {i}
            for out in node.outputs():
                writer[out] = i
        for earlier, later in [*collectives.order_edges(self.nodes), *symbol_edges(self.nodes)]:
            self.preds[later].add(earlier)
        self.succs: list[set[int]] = [set() for _ in self.nodes]
        for i, ps in enumerate(self.preds):
            for p in ps:
                self.succs[p].add(i)

    def _storage(self, name: str) -> str:
        buf = self.graph.buffers.get(name)
        return buf.storage if buf is not None and buf.storage else name

    # -- fusion

    def run(self) -> Schedule:
        groups = [Group([i], *(_node_group(n) or ((), ()))) for i, n in enumerate(self.nodes)]
        self.group_of = list(range(len(self.nodes)))
        self.groups = groups
        changed = True
        while changed:
            changed = False
            for a, b, tiny_only in fusion_pairs(self.nodes, self.preds, self.reads, FUSABLE):
                ga, gb = self.group_of[a], self.group_of[b]
                if ga == gb or not groups[ga].alive or not groups[gb].alive:
                    continue
                if tiny_only and not all(tiny(self.nodes[i]) for i in groups[ga].members + groups[gb].members):
                    continue
                if self._try_fuse(ga, gb):
                    changed = True
        order = self._topo_order()
        steps: list[object] = []
        for k, gi in enumerate(order):
            members = [self.nodes[i] for i in groups[gi].members]
            if isinstance(members[0], ir.ExternNode):
                steps.append(members[0])
            elif isinstance(members[0], ir.TemplateNode) and len(members) == 1 and not members[0].force:
                steps.append(members[0].library)  # nothing fused: the library's GEMM alone wins
            else:
                steps.append(self._make_kernel(f"k{k}", groups[gi], members))
        return Schedule(steps, self.decisions)

    def _try_fuse(self, ga: int, gb: int) -> bool:
        A, B = self.groups[ga], self.groups[gb]
        names = (self._label(A), self._label(B))
        if self._template(A) is not None or self._template(B) is not None:
            return self._try_epilogue(ga, gb, names)
        space = _combine((A.x, A.r), (B.x, B.r))
        if space is None:
            return self._try_rerange(ga, gb, names)
        return self._fuse_checked(ga, gb, names, space)

    def _try_rerange(self, ga: int, gb: int, names: tuple[str, str]) -> bool:
        """Groups over two shapes of the same points, as a ``view`` between (batch, tokens,
        features) and (batch * tokens, features) gives, fuse when one group is pointwise and
        can move onto the other's space (:mod:`coil.rerange`): a 2-D space its leading dims
        merge into, or a finer one (a reduction's space included) its dims split into."""
        A, B = self.groups[ga], self.groups[gb]
        for moving, staying in ((A, B), (B, A)):
            if moving.r:
                continue
            space = (tuple(staying.x), tuple(staying.r))
            # a reduction's whole space (a normalisation of its rows) or its outputs' space
            for target in dict.fromkeys((space[0] + space[1], space[0])):
                move = mover(tuple(moving.x), target)
                if move is None:
                    continue
                moves = [move(self.nodes[i], target) for i in moving.members]
                if all(m is not None for m in moves):
                    return self._fuse_moved(ga, gb, names, moving, moves, space)
        return self._decide(names, False, "iteration spaces differ")

    def _fuse_moved(self, ga: int, gb: int, names: tuple[str, str], moving: Group,
                    moves: list[ir.Node | None], space: tuple[tuple, tuple]) -> bool:
        """Fuse with ``moving``'s nodes replaced by ``moves``, put back if the fusion fails."""
        saved = {i: self.nodes[i] for i in moving.members}
        for i, moved in zip(moving.members, moves):
            assert moved is not None
            self.nodes[i] = moved
        if self._fuse_checked(ga, gb, names, space):
            return True
        for i, node in saved.items():
            self.nodes[i] = node
        return False

    def _template(self, g: Group) -> int | None:
        """The member that is a template node (always the group's first), if any."""
        first = g.members[0]
        return first if isinstance(self.nodes[first], ir.TemplateNode) else None

    def _try_epilogue(self, ga: int, gb: int, names: tuple[str, str]) -> bool:
        """Fuse pointwise consumers of a template's product into its kernel (the epilogue).
        A consumer over a reshape of the product's space with the same last dim (a linear
        layer's ``view`` back to (batch, tokens, features)) is re-indexed onto it."""
        A, B = self.groups[ga], self.groups[gb]
        if self._template(A) is None:
            A, B, ga, gb = B, A, gb, ga
        t = self._template(A)
        assert t is not None
        if self._template(B) is not None:
            return self._decide(names, False, "two templates")
        if any(not isinstance(self.nodes[i], ir.PointwiseNode) for i in B.members):
            return self._decide(names, False, "only pointwise nodes fuse after a template")
        if any(p in B.members for p in self.preds[t]):
            return self._decide(names, False, "prologue fusion into a template is not supported")
        written = {o for i in A.members for o in self.nodes[i].outputs()}
        if not any(self.reads[i] & written for i in B.members):
            return self._decide(names, False, "not a consumer of the template's product")
        saved = {i: self.nodes[i] for i in B.members}
        if tuple(B.x) != tuple(A.x):
            for i in B.members:
                moved = merge_leading(self.nodes[i], tuple(A.x))
                if moved is None:
                    return self._decide(names, False, "iteration spaces differ")
                self.nodes[i] = moved
        if self._fuse_checked(ga, gb, names, (tuple(A.x), ())):
            return True
        for i, node in saved.items():
            self.nodes[i] = node
        return False

    def _fuse_checked(self, ga: int, gb: int, names: tuple[str, str], space: tuple[tuple, tuple]) -> bool:
        A, B = self.groups[ga], self.groups[gb]
        members = sorted(A.members + B.members)
        nodes = [self.nodes[i] for i in members]
        device = nodes[0].device
        if any(n.device != device for n in nodes):
            return self._decide(names, False, "different devices")
        policy = self.policies.get(device.type)
        limit, source = self._fusion_limit(policy)
        if len(members) > limit:
            return self._decide(names, False, f"fusion-size limit {limit} ({source})")
        if self._creates_cycle(ga, gb):
            return self._decide(names, False, "would create a cycle")
        reason = self._dependency_conflict(members, space)
        if reason:
            return self._decide(names, False, reason)
        if policy is not None and not policy.can_fuse(space[0], space[1], nodes):
            return self._decide(names, False, "refused by the device's Scheduling")
        A.members = members
        A.x, A.r = space
        B.alive = False
        for i in B.members:
            self.group_of[i] = ga
        return self._decide(names, True, "fused")

    def _fusion_limit(self, policy: FusionPolicy | None) -> tuple[int, str]:
        """Most nodes one kernel may hold on a device, and which setting imposes it."""
        if policy is None:
            return 1, "no Scheduling for the device"
        if policy.max_fusion_size < self.max_fusion_size:
            return policy.max_fusion_size, "the device's Scheduling.max_fusion_size"
        return self.max_fusion_size, "the max_fusion_size knob"

    def _decide(self, names: tuple[str, str], fused: bool, reason: str) -> bool:
        self.decisions.append(FusionDecision(names[0], names[1], fused, reason))
        return fused

    def _label(self, g: Group) -> str:
        return "+".join(self.nodes[i].name for i in g.members)

    def _group_succs(self, g: int) -> set[int]:
        out: set[int] = set()
        for i in self.groups[g].members:
            for s in self.succs[i]:
                out.add(self.group_of[s])
        out.discard(g)
        return out

    def _creates_cycle(self, ga: int, gb: int) -> bool:
        """True if a path between the two groups passes through a third group."""
        for src, dst in ((ga, gb), (gb, ga)):
            stack = [s for s in self._group_succs(src) if s != dst]
            seen = set(stack)
            while stack:
                g = stack.pop()
                for s in self._group_succs(g):
                    if s == dst:
                        return True
                    if s not in seen:
                        seen.add(s)
                        stack.append(s)
        return False

    def _dependency_conflict(self, members: list[int], space: tuple[tuple, tuple]) -> str | None:
        """A node reading a buffer written in the same kernel must read exactly where it was
        written, in kernel variables (so the value is there when it is read)."""
        placed = {i: self._place(self.nodes[i], space) for i in members}
        written: dict[str, sympy.Expr] = {}
        for i in members:
            node = self.nodes[i]
            level, body, store = placed[i]
            if isinstance(node, ir.PointwiseNode) and node.mutates:
                others = [j for j in members if j != i]
                if any(node.mutates in {self._storage(r) for r in self.reads[j]} for j in others):
                    return "mutation of a buffer other fused nodes read"
            for ld in ir.loads(body):
                if ld.buffer in written:
                    if sympy.expand(ld.index - written[ld.buffer]) != 0:
                        return f"{node.name} reads {ld.buffer} at another index than it is written"
            for out in node.outputs():
                written[out] = store
        return None

    def _place(self, node: ir.Node, space: tuple[tuple, tuple]) -> tuple[str, ir.Value, sympy.Expr]:
        """The node's level in a kernel over ``space``, and its body and store index there."""
        x, r = space
        ranges = {**{_x(i): n for i, n in enumerate(x)}, **{_r(i): n for i, n in enumerate(r)}}
        if isinstance(node, ir.TemplateNode):
            return "x", ir.Const(node.layout.dtype, 0), simplify_in(node.store_index, ranges)
        if isinstance(node, ir.ReductionNode):
            return "r", _simplify_value(node.body, ranges), simplify_in(node.store_index, ranges)
        assert isinstance(node, ir.PointwiseNode)
        if tuple(node.ranges) == tuple(x) or not r:
            return "x", _simplify_value(node.body, ranges), simplify_in(node.store_index, ranges)
        mapping = {_x(len(x) + j): _r(j) for j in range(len(r))}
        body = ir.reindex_value(node.body, mapping)
        store = node.store_index.xreplace(mapping)
        return "r", _simplify_value(body, ranges), simplify_in(store, ranges)

    # -- ordering and kernels

    def _topo_order(self) -> list[int]:
        """Groups in dependency order: graph order, except that a ready group which frees
        more memory than it allocates (the last reader of a big buffer) runs first, so a
        large intermediate does not stay alive across unrelated work (GPT's qkv projection
        kept until v's copy at the end of attention). Collectives come before both and
        their waits after both (:func:`coil.collectives.order_class`)."""
        alive = [g for g, grp in enumerate(self.groups) if grp.alive]
        indeg = {g: 0 for g in alive}
        succ = {g: self._group_succs(g) for g in alive}
        for g in alive:
            for s in succ[g]:
                indeg[s] += 1
        memory = MemoryView(self, alive, deferrable(succ))
        # collectives start as early as they can, their waits run when nothing else is ready
        overlap = config.current().collective_overlap
        rank = {g: collectives.order_class(self.nodes[self.groups[g].members[0]], overlap) for g in alive}
        ready = {g for g in alive if indeg[g] == 0}
        order: list[int] = []
        while ready:
            g = min(ready, key=lambda c: (rank[c], *memory.priority(c), min(self.groups[c].members)))
            ready.discard(g)
            order.append(g)
            memory.scheduled(g)
            for s in succ[g]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    ready.add(s)
        assert len(order) == len(alive), "fusion produced a cycle"
        return order

    def _make_kernel(self, name: str, group: Group, members: list[ir.Node]) -> Kernel:
        member_set = set(group.members)
        outside_reads = {name for i, reads in enumerate(self.reads) if i not in member_set
                         for name in reads}
        outside_reads |= {name for node in self.nodes if isinstance(node, ir.ExternNode)
                          for name in node.aliases}
        graph_outputs = {o.name for o in self.graph.outputs if o.name}
        special = members[0] if isinstance(members[0], (ir.ScanNode, ir.ScatterNode)) else None
        template = members[0] if isinstance(members[0], ir.TemplateNode) else None
        knodes: list[KernelNode] = []
        if special is None:
            for node in members[1:] if template is not None else members:
                level, body, store = self._place(node, (group.x, group.r))
                stores = tuple(self._storage(o) for o in node.outputs())
                knodes.append(KernelNode(node, level, body, store, stores))
        knodes = [_resolve_storage(kn, self._storage) for kn in knodes]
        loops = _loops(knodes)
        written = {o for n in members for o in n.outputs()}
        internal = set()
        for buf in written:
            if buf in outside_reads or buf in graph_outputs or self._storage(buf) != buf:
                continue
            if _local_to_loop(buf, loops) or (template is not None and buf == template.name):
                internal.add(buf)  # a template's product is a value of each epilogue point
        outputs = sorted({self._storage(b) for b in written} - internal, key=_natural)
        reads: set[str] = set()
        for i in group.members:
            reads |= {self._storage(r) for r in self.reads[i]}
        inputs = sorted(reads - written - set(outputs), key=_natural)
        x_ranges = tuple(group.x)
        perm = memory_order(x_ranges, knodes, set(outputs)) if special is None and template is None else None
        if perm is not None:
            x_ranges, knodes = permute(perm, x_ranges, knodes)
            loops = _loops(knodes)
        symbols: set[sympy.Symbol] = set()
        exprs = list(group.x) + list(group.r)
        for kn in knodes:
            exprs.append(kn.store_index)
            exprs += [ld.index for ld in ir.loads(kn.body)]
            exprs += [v.expr for v in ir.walk(kn.body) if isinstance(v, ir.IndexValue)]
            exprs += [v.size for v in ir.walk(kn.body) if isinstance(v, ir.Indirect)]
        if special is not None:
            exprs += _special_exprs(special)
        if template is not None:
            exprs.append(template.store_index)
        for e in exprs:
            if isinstance(e, sympy.Basic):
                symbols |= {s for s in e.free_symbols if _is_size_symbol(s)}
        dtypes = {b: self.graph.buffers[b].layout.dtype for b in
                  set(inputs) | set(outputs) | internal if b in self.graph.buffers}
        origins = tuple(dict.fromkeys(o for n in members for o in n.origins))
        call = self._template_call(name, group, template) if template is not None else None
        return Kernel(name, x_ranges, tuple(group.r), knodes, loops, inputs, outputs, internal,
                      sorted(symbols, key=lambda s: s.name), dtypes, origins, special, template=call)

    def _template_call(self, name: str, group: Group, node: ir.TemplateNode) -> TemplateCall:
        """The product of a template kernel, and its epilogue as a kernel of its own (what the
        template competes against, after the library's product)."""
        unfused = None
        if len(group.members) > 1:
            rest = Group(group.members[1:], group.x, group.r)
            unfused = self._make_kernel(f"{name}_epilogue", rest, [self.nodes[i] for i in rest.members])
        return TemplateCall(node.template, templates.problem_of(node, self._storage), node.name,
                            node.store_index, templates.bias_operand(node, self._storage),
                            node.alpha, node.beta, node.measure, node, unfused)


def _special_exprs(node: ir.Node) -> list[sympy.Expr]:
    out: list[sympy.Expr] = [getattr(node, "store_index")]
    out += list(getattr(node, "ranges", ()))
    for attr in ("body", "base", "value"):
        v = getattr(node, attr, None)
        if isinstance(v, ir.Value):
            out += [ld.index for ld in ir.loads(v)]
            out += [w.expr for w in ir.walk(v) if isinstance(w, ir.IndexValue)]
            out += [w.size for w in ir.walk(v) if isinstance(w, ir.Indirect)]
    if isinstance(node, ir.ScanNode):
        out.append(node.scan_range)
    if isinstance(node, ir.ScatterNode):
        out += list(node.src_ranges) + [node.target_index]
        for ind in node.target_indirect:
            out += [ld.index for ld in ir.loads(ind)] + [ind.size]
            out += [w.expr for w in ir.walk(ind) if isinstance(w, ir.IndexValue)]  # full((4, 1), n)
    return out


def _is_size_symbol(s: sympy.Symbol) -> bool:
    name = s.name
    return not (name[0] in "xr" and name[1:].isdigit()) and not name.startswith("ind")


def _natural(name: str) -> tuple[str, int]:
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return head, int(tail) if tail else -1


def _x(i: int) -> sympy.Symbol:
    return sympy.Symbol(f"x{i}", integer=True, nonnegative=True)


def _r(i: int) -> sympy.Symbol:
    return sympy.Symbol(f"r{i}", integer=True, nonnegative=True)


def _simplify_value(value: ir.Value, ranges: dict) -> ir.Value:
    return ir.rewrite(value, index=lambda e: simplify_in(e, ranges),
                      op=lambda o: simplify_comparison(o, ranges))


def _loops(knodes: list[KernelNode]) -> list[Loop]:
    """Group consecutive same-level nodes into shared loops; a node that reads a reduction
    result of the current loop starts a new loop (the result is not final until it ends)."""
    loops: list[Loop] = []
    for kn in knodes:
        cur = loops[-1] if loops else None
        if cur is not None and cur.level == kn.level:
            reduced = {o for n in cur.nodes if n.is_reduction for o in n.node.outputs()}
            reads = {ld.buffer for ld in ir.loads(kn.body)}
            if not (reads & reduced):
                cur.nodes.append(kn)
                continue
        loops.append(Loop(kn.level, [kn]))
    return loops


def _local_to_loop(buf: str, loops: list[Loop]) -> bool:
    """A buffer can stay out of memory if it is written at x level (one value per x point), or
    if every reader sits in the loop that writes it."""
    for li, loop in enumerate(loops):
        for kn in loop.nodes:
            if buf in kn.node.outputs():
                if loop.level == "x" or kn.is_reduction:
                    return True
                return all(buf not in {ld.buffer for ld in ir.loads(other.body)}
                           for lj, other_loop in enumerate(loops) if lj != li
                           for other in other_loop.nodes)
    return False


def _resolve_storage(kn: KernelNode, storage: object) -> KernelNode:
    def fix(ld: ir.Load) -> ir.Value | None:
        target = storage(ld.buffer)  # type: ignore[operator]
        if target != ld.buffer:
            return dataclasses.replace(ld, buffer=target)
        return None
    body = ir.replace_loads(kn.body, fix)
    return KernelNode(kn.node, kn.level, body, kn.store_index, kn.stores)


def schedule(graph: LoweredGraph, policies: dict[str, FusionPolicy],
             max_fusion_size: int | None = None, freed_inputs: frozenset[str] = frozenset()) -> Schedule:
    """Schedule ``graph``; ``max_fusion_size`` defaults to the knob of the compile in progress
    (:func:`coil.config.current`), and each device's ``Scheduling`` may lower it.
    ``freed_inputs``: inputs whose memory dies with their last reader (a backward graph's
    saved activations), which the order counts as freed there."""
    return Scheduler(graph, policies, max_fusion_size, freed_inputs).run()


__all__ = ["schedule", "Schedule", "FusionDecision", "FusionPolicy"]
