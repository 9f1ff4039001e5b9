"""Coil's knobs: what each one is, how a value is read and checked, and the configuration in
force. The public face is :mod:`coil.sdk.config` (``coil.config``), which re-exports these and
adds what needs the plugin registry (checking ``options=`` keys against the loaded backends'
``Options``); the SDK's own modules (the caches, ``DeviceBackend.options``) read the knobs here,
beneath the registry.

Each knob is overridable by an environment variable (``COIL_<NAME>``), by
``torch.compile(..., options={...})`` and by ``coil.config.override``. Every value is checked
where it enters: a size outside its range, a float or a bool where an integer belongs, or a flag
that is not one of ``1/true/yes/on/0/false/no/off`` raises :class:`ConfigValueError` naming the
variable (or option) and what is valid. An empty environment variable means the knob's default.
Paths have ``~`` and ``$VARS`` expanded and are made absolute when read. A ``COIL_*`` variable
that nothing reads is logged once per process with the closest known name
(:func:`warn_unknown_variables`, called by the registry once plugins are loaded); variables read
outside this module are declared in :data:`OTHER_VARIABLES`.

Plugins add their own knobs, namespaced by backend name: a ``DeviceBackend`` declares an
``Options`` dataclass, and ``"<backend>.<field>"`` keys (env ``COIL_<BACKEND>_<FIELD>``) set
them; :func:`backend_options` resolves them for the compile in progress (:func:`current`)."""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import logging
import operator
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, get_args

from .errors import CoilError, ConfigError

log = logging.getLogger(__name__)

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}

#: Values of the ``progress`` knob.
TemplateMode = Literal["auto", "tune", "heuristic", "force", "off"]
ProgressMode = Literal["auto", "on", "off"]
GraphCaptureMode = Literal["auto", "on", "off"]


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return os.path.abspath(os.path.join(os.path.expanduser(base), "coil"))


def _knob(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
          minimum: int | None = None, path: bool = False, size: bool = False,
          choices: tuple[str, ...] = (), flag_words: bool = False) -> Any:
    """A Config field with its validation: ``minimum`` for integers, ``path`` for folders
    (expanded, absolute), ``size`` for byte counts (``512M``, ``2G`` accepted), ``choices``
    for a closed set of words (matched ignoring case); ``flag_words`` also takes a flag's
    values for ``on``/``off`` (a knob that was a flag before it had more choices)."""
    meta = {"minimum": minimum, "path": path, "size": size, "choices": choices, "flag_words": flag_words}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass
class Config:
    """Every knob Coil has. The field name, upper-cased and prefixed with ``COIL_``, is its
    environment variable."""

    #: Where every on-disk cache lives (compiled kernels, autotune results). Empty: the default
    #: (``$XDG_CACHE_HOME/coil``, else ``~/.cache/coil``).
    cache_dir: str = _knob(default_factory=_default_cache_dir, path=True)
    #: Most bytes the on-disk cache may hold before the least recently used entries are evicted
    #: (an integer, or with a unit: ``512M``, ``4G``).
    cache_max_bytes: int = _knob(2 * 2**30, minimum=1, size=True)
    #: When set, every compiled graph writes its generated source and fusion decisions here.
    debug_dir: str = _knob("", path=True)
    #: Most scheduler nodes one fused kernel may hold; a device's own limit
    #: (``Scheduling.max_fusion_size``) applies too, and the smaller one wins.
    max_fusion_size: int = _knob(64, minimum=1)
    #: A pointwise value used more than once is computed into a buffer (instead of recomputed
    #: by each user) when it reads more than this many buffers.
    realize_reads_threshold: int = _knob(4, minimum=0)
    #: ... or when its body has more than this many operations.
    realize_opcount_threshold: int = _knob(30, minimum=0)
    #: Record compiled graphs once and replay them (CUDA graphs, on backends that can;
    #: :mod:`coil.capture`): ``auto`` records inference graphs and keeps a recording only
    #: where its replay measured faster on the first call; ``on`` (what
    #: ``torch.compile(..., mode="reduce-overhead")`` sets) records every graph it can;
    #: ``off`` never records. A flag's values are accepted too (true: on, false: off).
    graph_capture: GraphCaptureMode = _knob("auto", choices=get_args(GraphCaptureMode), flag_words=True)
    #: After every ATen call whose result Coil's code reads, compare the result's strides with
    #: the ones that code was generated for (eager's meta function's) and copy it into those on
    #: a mismatch. One comparison per call; turning it off trades a silent wrong result for it.
    check_extern_layouts: bool = _knob(True)
    #: Let a kernel store an output over the memory of an input that dies in it, where it
    #: reads that input only at the index it writes (:mod:`coil.inplace`); off, an output only
    #: takes memory freed by an earlier step.
    inplace_buffers: bool = _knob(True)
    #: Start each collective (``torch.distributed``'s functional all-reduce, all-gather...)
    #: as early as its inputs allow and wait for it just before the first step that reads its
    #: result, so the work that does not need it runs while it is in flight
    #: (:mod:`coil.collectives`); off, the wait comes right after the collective.
    collective_overlap: bool = _knob(True)
    #: Under ``torch.distributed`` with more than one rank, ranks that compile the same graph
    #: tell each other how it went through the process group's store, so a compile that fails
    #: on one rank fails on all of them, naming that rank, instead of leaving the others
    #: waiting in a collective (:mod:`coil.compile_agreement`).
    compile_agreement: bool = _knob(True)
    #: Replace hand-written attention (``softmax(q @ k.mT * scale + mask) @ v``) by one
    #: ``scaled_dot_product_attention`` call where the two are equivalent (:mod:`coil.attention`),
    #: and give such calls whose mask the graph builds from constants alone no mask (True
    #: everywhere) or ``is_causal`` (the causal triangle) instead (:mod:`coil.full_masks`).
    attention_rewrite: bool = _knob(True)
    #: Channels-last convolutions in training graphs too (saved activations included), where
    #: the device's backend asks for them (``DeviceBackend.prefers_channels_last``, by default
    #: ``Capabilities.conv_channels_last``; inference graphs always ask). On the H200, ResNet-18's bf16 training step with it: 11.6 ms against 11.9
    #: without, GPU work 5.9 ms against 7.2 (cuDNN's layout transposes gone); measured
    #: side by side in one process. (An earlier slowdown, 25.8 ms, came from a contended host.)
    training_channels_last: bool = _knob(True)
    #: Inference graphs compiled while grad mode is off treat the model's parameters and
    #: buffers as constants (:mod:`coil.freezing`, as Inductor's ``freezing``): computations
    #: of parameters alone run once at compile time, batch norms after convolutions fold into
    #: the convolutions' weights, and device backends may pre-pack convolution weights into
    #: their library's layout (``DeviceBackend.frozen_convolution``). Each call checks that
    #: every parameter it folded is the same tensor, at the same address and version, and
    #: recompiles the graph (with a warning) where one is not; a write that bypasses the
    #: version counter (``param.data.copy_(...)``) is not seen. Such graphs skip the graph
    #: cache (their constants are this process's).
    freezing: bool = _knob(False)
    #: Each kernel launch inside a ``torch.profiler`` range named ``coil:<kernel>``, so that
    #: profiler tables show every generated kernel's time (ATen calls show by themselves).
    #: About a microsecond per launch while no profiler runs.
    profile_kernels: bool = _knob(False)
    #: Runs of consecutive kernel launches with static sizes compiled into one host function
    #: of the device's module, where its backend can (``Capabilities.host_programs``: the C++
    #: plugin): the wrapper calls the module once per run, and the run's short-lived buffers
    #: are the host function's memory instead of tensors (:mod:`coil.host_programs`). Off
    #: with ``profile_kernels``, which times launches one by one.
    host_programs: bool = _knob(True)
    #: Self-check mode: run every compiled graph beside eager and raise at the first output
    #: that differs.
    check: bool = _knob(False)
    #: A self-overwriting progress line on stderr while a graph compiles for more than a few
    #: seconds (graph, stage, kernels built, seconds): ``auto`` when stderr is a terminal,
    #: ``on`` always, ``off`` never.
    progress: ProgressMode = _knob("auto", choices=get_args(ProgressMode))
    #: Matrix products with pointwise work after them, as template kernels with that work
    #: fused (``coil_templates`` plugins, for backends that speak the template's dialect):
    #: ``auto`` asks the template's heuristic (``Template.prefer``) and, where it says yes
    #: and the backend tunes, measures the template against the device's library on the
    #: first launch; ``tune`` measures every product a template supports (each measured
    #: template is seconds of builds on a cold cache); ``heuristic`` never measures;
    #: ``force`` uses a template wherever one applies, even with nothing to fuse (tests);
    #: ``off`` always calls the library.
    templates: TemplateMode = _knob("auto", choices=get_args(TemplateMode))
    #: Keep each compiled graph (wrapper and the backends' exported modules) in the on-disk
    #: cache, keyed by everything its compile depends on (:mod:`coil.graph_cache`), so a later
    #: process loads it without lowering or codegen.
    graph_cache: bool = _knob(True)
    #: A Redis server shared by many machines behind the local cache
    #: (``redis://host:port/db``, ``?prefix=NAME`` to share one server between projects;
    #: :mod:`coil.sdk.remotecache`). Empty: the local cache alone.
    remote_cache: str = _knob("")
    #: Plugin options set by ``options=`` or ``coil.config.override``: ``"<backend>.<field>"`` -> value.
    plugin_options: dict[str, Any] = dataclasses.field(default_factory=dict, metadata={"knob": False})
    #: ``COIL_*`` environment variables as read with the knobs (plugin options read them too).
    environ: dict[str, str] = dataclasses.field(default_factory=dict, repr=False,
                                                metadata={"knob": False})


_FIELDS = {f.name: f for f in dataclasses.fields(Config) if f.metadata.get("knob", True)}

#: ``COIL_*`` variables that are not knobs of :class:`Config` nor plugin options, and who reads
#: them. Any other ``COIL_*`` variable is reported as unknown; declare new ones here.
OTHER_VARIABLES: dict[str, str] = {
    "COIL_NO_AUTOLOAD": "coil.sdk.registry: load no entry-point plugin (Coil's own included)",
    "COIL_BLOCK_PLUGINS": "coil.sdk.registry: comma-separated plugin names not to load",
    "COIL_TRITON_COMPILE_WORKERS": "coil_cuda_triton: processes building Triton kernels (0: in-process)",
    "COIL_TRITON_LAUNCHER": "coil_cuda_triton: 'ctypes' launches kernels without the C launcher",
    "COIL_TEST_DEVICE": "tests: the device the differential tests run on",
    "COIL_TEST_BACKEND": "tests: 'triton' routes the cpu device to the interpreted Triton plugin",
    "COIL_TEST_OWN_CACHE": "tests/conftest.py: set by the suite itself, each test process makes its own cache",
    "COIL_TEST_WORLD": "tests/test_distributed.py: processes per distributed job (one GPU each with cuda)",
    "COIL_OPINFO_BACKEND": "tests/test_opinfo.py: the torch.compile backend under test",
    "COIL_OPINFO_FULL": "tests/test_opinfo.py: every sample of every op",
    "COIL_OPINFO_SAMPLES": "tests/test_opinfo.py: samples per op",
    "COIL_OPINFO_TIMEOUT": "tests/test_opinfo.py: seconds per op",
    "COIL_UPDATE_GOLDEN": "tests/test_golden.py: rewrite the golden files",
    "COIL_FUZZ_EXAMPLES": "tests/test_fuzz.py: programs the fuzzer runs",
    "COIL_FUZZ_REPRO_DIR": "tests/test_fuzz.py: where the fuzzer writes repro scripts",
}


class ConfigValueError(ConfigError):
    """A knob given a value it cannot take; names the variable or option and what is valid."""

    def __init__(self, source: str, value: Any, expected: str) -> None:
        CoilError.__init__(self, f"{source}={value!r} is not valid: expected {expected}. "
                                 f"Give a valid value, or unset it for the default.")
        self.key = source
        self.known: list[str] = []
        self.value = value
        self.expected = expected


# ----------------------------------------------------------------------------- reading values


def _kind(kind: Any) -> Any:
    kinds = {"bool": bool, "int": int, "float": float, "str": str}
    return kinds.get(kind, kind) if isinstance(kind, str) else kind


def _literal_choices(kind: Any) -> tuple[str, ...]:
    """The words of a plugin option typed ``Literal["a", "b"]`` (the annotation, or its text
    under ``from __future__ import annotations``); () for any other type."""
    if isinstance(kind, str):
        match = re.fullmatch(r"(?:typing\.)?Literal\[(.*)\]", kind.strip())
        if match is None:
            return ()
        words = re.findall(r"""(['"])(.*?)\1""", match.group(1))
        return tuple(w.lower() for _, w in words)
    if getattr(kind, "__origin__", None) is Literal:
        return tuple(str(w).lower() for w in get_args(kind))
    return ()


def _as_bool(source: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigValueError(source, value, f"a flag: one of {', '.join(_TRUE + _FALSE)}")


def _as_int(source: str, value: Any, minimum: int | None, size: bool) -> int:
    noun = "an integer" + ("" if minimum is None else f" >= {minimum}")
    if size:
        noun += " (bytes; the units K, M, G, T multiply by powers of 1024: '512M', '2G')"
    number: int | None = None
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        unit = re.fullmatch(r"(\d+)\s*(?:([kmgt])i?)?b?", text, re.IGNORECASE) if size else None
        if unit:
            number = int(unit.group(1)) * _SIZE_UNITS[(unit.group(2) or "").lower()]
        elif re.fullmatch(r"[+-]?\d+", text):
            number = int(text)
    elif not isinstance(value, (bool, float)):
        with contextlib.suppress(TypeError):
            number = operator.index(value)  # int and int-like (numpy) values, not floats or bools
    if number is None or (minimum is not None and number < minimum):
        raise ConfigValueError(source, value, noun)
    return number


def _as_path(source: str, value: Any) -> str | None:
    """``value`` with ``~`` and ``$VARS`` expanded, absolute; None when empty (the default)."""
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigValueError(source, value, "a folder path")
    text = os.fspath(value).strip()
    if not text:
        return None
    expanded = os.path.expanduser(os.path.expandvars(text))
    missing = re.search(r"\$\{?([A-Za-z_]\w*)", expanded)
    if missing:
        raise ConfigValueError(source, value, f"a folder path (environment variable "
                                              f"{missing.group(1)} is not set)")
    return os.path.abspath(expanded)


def _as_choice(source: str, value: Any, choices: tuple[str, ...], flag_words: bool = False) -> str:
    text = value.strip().lower() if isinstance(value, str) else None
    if flag_words and text not in choices:
        if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)) or text in _TRUE + _FALSE:
            text = "on" if _as_bool(source, value) else "off"
    if text not in choices:
        raise ConfigValueError(source, value, f"one of {', '.join(choices)}")
    return text


def _default(name: str) -> Any:
    f = _FIELDS[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _coerce(name: str, value: Any, kind: Any = None, source: str | None = None) -> Any:
    """``value`` (a string from the environment, or any value) as knob ``name``'s type, checked;
    ``kind`` is given for plugin options. ``source`` names the value in errors (the
    environment variable it came from, else the option ``name``)."""
    meta = _FIELDS[name].metadata if kind is None else {"choices": _literal_choices(kind)}
    kind = _kind(_FIELDS[name].type if kind is None else kind)
    source = source or name
    if meta.get("choices"):
        return _as_choice(source, value, meta["choices"], meta.get("flag_words", False))
    if kind is bool:
        return _as_bool(source, value)
    if kind is int:
        return _as_int(source, value, meta.get("minimum"), meta.get("size", False))
    if kind is float:
        if isinstance(value, bool):
            raise ConfigValueError(source, value, "a number")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigValueError(source, value, "a number") from None
    if meta.get("path"):
        path = _as_path(source, value)
        return _default(name) if path is None else path
    return str(value) if kind is str else value


def knob_variable(name: str) -> str:
    """The environment variable of knob ``name``: ``COIL_<NAME>``."""
    return f"COIL_{name.upper()}"


def defaults() -> dict[str, Any]:
    """Every knob's default value, by name."""
    return {name: _default(name) for name in _FIELDS}


def from_env() -> Config:
    """The configuration the environment alone gives (no overrides, not cached);
    :class:`ConfigValueError` when a variable holds a value its knob cannot take."""
    cfg = Config(environ={k: v for k, v in os.environ.items() if k.startswith("COIL_")})
    for name in _FIELDS:
        env = cfg.environ.get(knob_variable(name))
        if env is not None and env.strip():  # empty: the default
            setattr(cfg, name, _coerce(name, env, source=knob_variable(name)))
    return cfg


_current: Config | None = None


def get() -> Config:
    """The configuration in force (environment variables read once, then overrides applied);
    :class:`ConfigValueError` when a ``COIL_*`` variable holds a value its knob cannot take."""
    global _current
    if _current is None:
        _current = from_env()
    return _current


def reload_from_env() -> None:
    """Forget overrides and read the environment again (tests use this)."""
    global _current
    _current = None


def checked(options: dict[str, Any] | None, backends: Iterable[Any] = ()) -> dict[str, Any]:
    """``options`` checked against the knobs, and ``"<backend>.<field>"`` keys against the
    ``Options`` of ``backends``; unknown keys raise :class:`ConfigError`, values a knob cannot
    take :class:`ConfigValueError`. (``coil.config.validated`` passes the loaded backends.)"""
    out: dict[str, Any] = {}
    fields: dict[str, dataclasses.Field] | None = None
    for key, value in (options or {}).items():
        if "." in key:
            fields = _plugin_fields(backends) if fields is None else fields
            out[key] = _plugin_option(fields, key, value)
        elif key not in _FIELDS:
            raise ConfigError(key, list(_FIELDS))
        else:
            out[key] = _coerce(key, value)
    return out


def applied(cfg: Config, options: dict[str, Any]) -> Config:
    """A copy of ``cfg`` with ``options`` (already :func:`checked`) set; ``cfg`` is left alone."""
    out = dataclasses.replace(cfg, plugin_options=dict(cfg.plugin_options))
    for key, value in options.items():
        if "." in key:
            out.plugin_options[key] = value
        else:
            setattr(out, key, value)
    return out


@contextlib.contextmanager
def in_force(cfg: Config) -> Iterator[Config]:
    """Make ``cfg`` what :func:`get` returns inside the block (``coil.config.override`` does)."""
    global _current
    saved = get()
    _current = cfg
    try:
        yield cfg
    finally:
        _current = saved


# ----------------------------------------------------------------------------- the compile in progress

_active: contextvars.ContextVar[Config | None] = contextvars.ContextVar("coil_active_config", default=None)


def current() -> Config:
    """The configuration of the compile in progress (with its ``torch.compile`` options), or
    :func:`get` outside a compile. Plugins reach it through ``DeviceBackend.options``."""
    cfg = _active.get()
    return get() if cfg is None else cfg


@contextlib.contextmanager
def active(cfg: Config) -> Iterator[Config]:
    """Make ``cfg`` the configuration of the compile in progress (``compile_graph`` does)."""
    token = _active.set(cfg)
    try:
        yield cfg
    finally:
        _active.reset(token)


# ----------------------------------------------------------------------------- plugin options


def namespace(backend: Any) -> str:
    """The prefix of a backend's option keys: its ``name`` (else its class name)."""
    return backend.name or type(backend).__name__


def env_var(backend_name: str, field_name: str) -> str:
    """``COIL_<BACKEND>_<FIELD>``, upper-cased, other characters as ``_``."""
    return re.sub(r"\W", "_", f"COIL_{backend_name}_{field_name}").upper()


def _option_fields(backend: Any) -> list[dataclasses.Field]:
    cls = getattr(backend, "Options", None)
    if cls is None:
        return []
    if not dataclasses.is_dataclass(cls):
        raise ConfigError(f"{namespace(backend)}.Options", [],
                          "a backend's Options must be a dataclass (decorate it with "
                          "@dataclasses.dataclass(frozen=True))")
    return [f for f in dataclasses.fields(cls) if f.init]


def _plugin_fields(backends: Iterable[Any]) -> dict[str, dataclasses.Field]:
    """``"<backend>.<field>"`` -> field, for every backend of ``backends`` that declares Options."""
    out: dict[str, dataclasses.Field] = {}
    for backend in backends:
        out.update({f"{namespace(backend)}.{f.name}": f for f in _option_fields(backend)})
    return out


def _plugin_option(known: dict[str, dataclasses.Field], key: str, value: Any) -> Any:
    if key in known:
        return _coerce(key, value, known[key].type)
    prefix = key.split(".")[0] + "."
    same_plugin = [k for k in known if k.startswith(prefix)]
    if same_plugin:
        raise ConfigError(key, same_plugin, f"unknown option of plugin {prefix[:-1]!r}")
    raise ConfigError(key, list(known) + list(_FIELDS), "no registered backend has the option")


def backend_options(backend: Any, cfg: Config | None = None) -> Any:
    """The ``backend.Options`` instance in force for ``cfg`` (default: :func:`current`):
    defaults, then ``COIL_<BACKEND>_<FIELD>`` variables, then ``options=``/``coil.config.override``
    values. None when the backend declares no Options."""
    fields = _option_fields(backend)
    if not fields:
        return None
    cfg = current() if cfg is None else cfg
    ns = namespace(backend)
    values: dict[str, Any] = {}
    for f in fields:
        key = f"{ns}.{f.name}"
        env = cfg.environ.get(env_var(ns, f.name))
        if key in cfg.plugin_options:
            values[f.name] = cfg.plugin_options[key]
        elif env is not None and env.strip():  # empty: the default
            values[f.name] = _coerce(key, env, f.type, source=env_var(ns, f.name))
    return backend.Options(**values)


def options_key(options: Any) -> str:
    """A stable one-line spelling of an Options instance, for cache keys ("" for None)."""
    if options is None:
        return ""
    return ";".join(f"{f.name}={getattr(options, f.name)!r}"
                    for f in sorted(dataclasses.fields(options), key=lambda f: f.name))


# ----------------------------------------------------------------------------- unknown variables


def known_variables(backends: Iterable[Any] = ()) -> dict[str, str]:
    """Every ``COIL_*`` variable something reads -> what it is: the knobs, the options of
    ``backends`` (``coil.config.known_variables()`` passes the loaded ones), and
    :data:`OTHER_VARIABLES`."""
    out = {knob_variable(name): f"knob {name}" for name in _FIELDS}
    for backend in backends:
        with contextlib.suppress(ConfigError):  # a malformed Options is reported when used
            for f in _option_fields(backend):
                out[env_var(namespace(backend), f.name)] = f"option {namespace(backend)}.{f.name}"
    out.update(OTHER_VARIABLES)
    return out


def unknown_variables(backends: Iterable[Any] = (),
                      environ: dict[str, str] | None = None) -> list[tuple[str, str | None]]:
    """``COIL_*`` variables of ``environ`` (default: the process's) that neither a knob, nor an
    option of ``backends``, nor :data:`OTHER_VARIABLES` names, each with the closest known
    name (None when nothing is close)."""
    environ = os.environ if environ is None else environ
    known = known_variables(backends)
    out = []
    for name in sorted(k for k in environ if k.startswith("COIL_") and k not in known):
        close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
        out.append((name, close[0] if close else None))
    return out


_warned: set[str] = set()


def describe_unknown(name: str, closest: str | None) -> str:
    """One sentence about an unknown ``COIL_*`` variable."""
    hint = (f"did you mean {closest}?" if closest else
            "Coil's variables are listed by `coil doctor` and in the README")
    return f"{name} is set but neither Coil nor a loaded plugin reads it (ignored); {hint}"


def warn_unknown_variables(backends: Iterable[Any]) -> None:
    """Log each unknown ``COIL_*`` variable once per process (the plugin registry calls this
    with its backends once its plugins are loaded, so their options count as known)."""
    for name, closest in unknown_variables(backends):
        if name not in _warned:
            _warned.add(name)
            log.warning("%s", describe_unknown(name, closest))


def env_flag(name: str) -> bool:
    """A flag variable of :data:`OTHER_VARIABLES` (``COIL_NO_AUTOLOAD``, say), read as strictly
    as the knobs: unset or empty is False, a value that is not a flag raises."""
    value = os.environ.get(name, "")
    return bool(value.strip()) and _as_bool(name, value)


__all__ = [
    "Config", "ConfigValueError", "TemplateMode", "ProgressMode", "GraphCaptureMode", "OTHER_VARIABLES",
    "knob_variable", "defaults", "from_env", "get", "reload_from_env", "checked", "applied", "in_force",
    "current", "active", "namespace", "env_var", "backend_options", "options_key", "known_variables",
    "unknown_variables", "describe_unknown", "warn_unknown_variables", "env_flag",
]
