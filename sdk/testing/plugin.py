"""The conformance kit's pytest plugin, registered under ``pytest11`` so its options exist in
every session (``pytest --pyargs coil.sdk.testing --coil-device=NAME``).

It is loaded by every pytest run in an environment where Coil is installed, so it stays inert
unless the kit's tests are collected or its options are given: it registers the ``coil_tier``
marker and its options, and touches only items carrying that marker. For the kit it routes a
backend to the device (``--coil-backend``), selects tiers (``--coil-tiers``), skips tiers the
device's ``Capabilities`` lack, provides the ``coil_kit`` fixture, and keeps the opinfo tier's
expected-failures file (``--coil-expected-failures``, ``--coil-update-expected-failures``)."""
from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any, Iterator

import pytest

from coil.sdk import registry
from coil.sdk.errors import CoilError

from . import expected as _expected
from . import tiers as _tiers
from .routing import route

KIT_DIR = Path(__file__).resolve().parent
PACKAGE = __name__.rpartition(".")[0]
TIER_PROPERTY = "coil_tier"
OPINFO_OP_PROPERTY = "coil_opinfo_op"
OPINFO_FAILURE_PROPERTY = "coil_opinfo_failure"


@dataclasses.dataclass
class KitOptions:
    """The kit's command-line options, and what the run learned (opinfo outcomes)."""

    device: str | None = None
    tiers: tuple[str, ...] = _tiers.DEFAULT_TIERS
    backend_spec: str | None = None
    opinfo_ops: str = ""
    opinfo_samples: int = 2
    opinfo_timeout: float = 60.0
    expected_path: str | None = None
    update_expected: bool = False
    expected: dict[str, str] = dataclasses.field(default_factory=dict)
    routing: Any = None
    tested_ops: set[str] = dataclasses.field(default_factory=set)
    failing_ops: dict[str, str] = dataclasses.field(default_factory=dict)
    xpassed_ops: list[str] = dataclasses.field(default_factory=list)
    wrote_expected: int | None = None

    @property
    def device_type(self) -> str:
        return (self.device or "").partition(":")[0]


_KEY = pytest.StashKey[KitOptions]()


def options_of(config: pytest.Config) -> KitOptions:
    return config.stash.get(_KEY, None) or KitOptions()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("coil", "Coil conformance kit (pytest --pyargs coil.sdk.testing)")
    group.addoption("--coil-device", metavar="NAME",
                    help="device type under test (a Coil backend must serve it)")
    group.addoption("--coil-backend", metavar="MODULE:FACTORY",
                    help="register FACTORY() for --coil-device before the tests "
                         "(coil.register_backend_for_device)")
    group.addoption("--coil-tiers", metavar="T1,T2",
                    help=f"tiers to run (default: all but opinfo); known: {', '.join(_tiers.TIERS)}")
    group.addoption("--coil-opinfo", action="store_true", help="add the opinfo tier")
    group.addoption("--coil-opinfo-ops", metavar="OPS", default="",
                    help="comma-separated OpInfo names for the opinfo tier, or 'all' "
                         "(default: the kit's representative list)")
    group.addoption("--coil-opinfo-samples", metavar="N", type=int, default=2,
                    help="samples per OpInfo (default 2)")
    group.addoption("--coil-expected-failures", metavar="FILE",
                    help="the plugin's expected opinfo failures (one OpInfo name a line)")
    group.addoption("--coil-update-expected-failures", action="store_true",
                    help="rewrite --coil-expected-failures from this run's opinfo results")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "coil_tier(name): the Coil conformance-kit tier of a test")
    opts = _read_options(config)
    config.stash[_KEY] = opts
    if not opts.device:
        return
    config.pluginmanager.register(KitSession(opts), "coil-conformance-session")
    if opts.backend_spec:
        try:
            opts.routing = route(opts.device_type, opts.backend_spec)
        except CoilError as exc:
            raise pytest.UsageError(str(exc)) from exc


def _read_options(config: pytest.Config) -> KitOptions:
    opt = config.getoption
    opts = KitOptions(device=opt("coil_device"), backend_spec=opt("coil_backend"),
                      opinfo_ops=opt("coil_opinfo_ops"), opinfo_samples=opt("coil_opinfo_samples"),
                      expected_path=opt("coil_expected_failures"),
                      update_expected=opt("coil_update_expected_failures"))
    try:
        opts.tiers = _tiers.parse_tiers(opt("coil_tiers"), opinfo=opt("coil_opinfo"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if opts.backend_spec and not opts.device:
        raise pytest.UsageError("--coil-backend needs --coil-device=NAME (the device it serves)")
    if opts.update_expected and not opts.expected_path:
        raise pytest.UsageError("--coil-update-expected-failures needs --coil-expected-failures=FILE")
    if opts.expected_path:
        opts.expected = _expected.read(opts.expected_path)
    return opts


def pytest_unconfigure(config: pytest.Config) -> None:
    opts = config.stash.get(_KEY, None)
    if opts is not None and opts.routing is not None:
        opts.routing.undo()
        opts.routing = None


class KitModule(pytest.Module):
    """A kit test module, imported by its package name (``coil.sdk.testing.test_x``) rather
    than by path: under an editable install the path alone would make a second copy of
    ``coil.sdk`` named ``sdk``."""

    def _getobj(self) -> Any:
        return importlib.import_module(f"{PACKAGE}.{self.path.stem}")


def pytest_pycollect_makemodule(module_path: Path, parent: Any) -> Any:
    if module_path.name.startswith("test_") and module_path.parent.resolve() == KIT_DIR:
        return KitModule.from_parent(parent, path=module_path)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("coil_tier") for item in items):
        return
    opts = options_of(config)
    if not opts.device:
        raise pytest.UsageError("the Coil conformance kit needs the device under test: "
                                "pytest --pyargs coil.sdk.testing --coil-device=NAME")
    keep, deselected = [], []
    for item in items:
        marker = item.get_closest_marker("coil_tier")
        if marker is None:
            keep.append(item)
        elif marker.args[0] in opts.tiers:
            item.user_properties.append((TIER_PROPERTY, marker.args[0]))
            _mark_expected_failure(item, opts)
            keep.append(item)
        else:
            deselected.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = _in_tier_order(keep)


def _in_tier_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """Kit items sorted by tier (runtime first), in the slots kit items held; others stay."""
    order = {tier: i for i, tier in enumerate(_tiers.TIERS)}
    slots = [i for i, item in enumerate(items) if item.get_closest_marker("coil_tier")]
    kit = sorted((items[i] for i in slots), key=lambda it: order[it.get_closest_marker("coil_tier").args[0]])
    result = list(items)
    for slot, item in zip(slots, kit):
        result[slot] = item
    return result


def _mark_expected_failure(item: pytest.Item, opts: KitOptions) -> None:
    op = getattr(item, "callspec", None) and item.callspec.params.get("opinfo_op")
    if not op:
        return
    item.user_properties.append((OPINFO_OP_PROPERTY, op))
    if op in opts.expected:
        reason = opts.expected[op] or "listed"
        item.add_marker(pytest.mark.xfail(reason=f"expected failure: {reason}", strict=False))


def _backend(opts: KitOptions) -> Any:
    return registry.registry().backends.get(opts.device_type)


class KitSession:
    """The hooks that act only in a run with ``--coil-device`` (registered then): skip tiers
    the device lacks, record opinfo outcomes, keep the expected-failures file."""

    def __init__(self, opts: KitOptions) -> None:
        self.opts = opts

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        marker = item.get_closest_marker("coil_tier")
        if marker is None:
            return
        backend = _backend(self.opts)
        if backend is None:  # the coil_kit fixture reports it, with the known devices
            return
        reason = _tiers.missing_capability(marker.args[0], backend.capabilities)
        if reason is not None:
            pytest.skip(f"tier {marker.args[0]}: {reason}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        op = props.get(OPINFO_OP_PROPERTY)
        if report.when != "call" or op is None:
            return
        self.opts.tested_ops.add(op)
        if OPINFO_FAILURE_PROPERTY in props:
            self.opts.failing_ops[op] = props[OPINFO_FAILURE_PROPERTY]
        elif report.passed and hasattr(report, "wasxfail"):
            self.opts.xpassed_ops.append(op)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        opts = self.opts
        if opts.update_expected and opts.expected_path and opts.tested_ops:
            entries = _expected.updated(opts.expected, opts.failing_ops, opts.tested_ops)
            _expected.write(opts.expected_path, entries, opts.device or "")
            opts.wrote_expected = len(entries)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        opts = self.opts
        if opts.xpassed_ops:
            terminalreporter.section("Coil conformance: expected failures that now pass")
            for op in opts.xpassed_ops:
                terminalreporter.line(f"  {op} (drop it from {opts.expected_path})")
        if opts.wrote_expected is not None:
            terminalreporter.line(f"coil conformance: wrote {opts.wrote_expected} expected "
                                  f"failure(s) to {opts.expected_path}")


@pytest.fixture(scope="session")
def _coil_kit_session(request: pytest.FixtureRequest) -> Any:
    # torch and the kit only once a test asks for a kit: this plugin loads in every pytest session
    import torch

    from .kit import Kit
    opts = options_of(request.config)
    backend = _backend(opts)
    if backend is None:
        registry.registry().backend_for(opts.device_type)  # raises NoBackendError, listing devices
    return Kit(torch.device(opts.device), backend, opts)


@pytest.fixture
def coil_kit(_coil_kit_session: Any) -> Iterator[Any]:
    """The device under test (:class:`coil.sdk.testing.kit.Kit`), from a fresh Dynamo state."""
    import torch  # not at the top: this plugin loads in every pytest session
    torch._dynamo.reset()
    yield _coil_kit_session
    torch._dynamo.reset()
