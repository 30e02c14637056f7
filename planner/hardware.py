"""Memory tiers, the links between them, and the compute that the cost model needs.

Tier names: ``hbm`` (device memory) and any number of remote tiers, conventionally ``pool`` (the SuperNode's
shared memory pool) and ``host`` (host DRAM over PCIe). A Link moves bytes one way between HBM and one remote
tier; a link with several channels carries that many transfers at once.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property

from planner.errors import InputError
from planner.fileio import read_json
from planner.units import parse_bandwidth, parse_size, parse_time

HBM = "hbm"


@dataclass(frozen=True)
class Tier:
    name: str
    capacity_bytes: int


@dataclass(frozen=True)
class Link:
    """A one-way link. ``name`` is the stream name in plans (``d2h``, ``h2d``, ``d2p``, ``p2d``)."""

    name: str
    src: str
    dst: str
    bandwidth_Bps: float
    latency_s: float = 0.0
    channels: int = 1


@dataclass(frozen=True)
class Hardware:
    """One accelerator's view of the machine: tiers, links, compute throughput and HBM bandwidth."""

    name: str
    tiers: tuple[Tier, ...]
    links: tuple[Link, ...]
    peak_flops: float
    hbm_bandwidth_Bps: float
    launch_overhead_s: float = 0.0
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def tier(self, name: str) -> Tier:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)

    def link(self, name: str) -> Link:
        return self.links_by_name[name]

    @cached_property
    def links_by_name(self) -> dict[str, Link]:
        """Each link by its name, the stream name in plans."""
        return {ln.name: ln for ln in self.links}

    @property
    def hbm_bytes(self) -> int:
        return self.tier(HBM).capacity_bytes

    def with_hbm(self, nbytes: int) -> Hardware:
        """This hardware with ``nbytes`` of HBM (``2**62``: unbounded, for no-offload references)."""
        return replace(self, tiers=tuple(Tier(t.name, nbytes) if t.name == HBM else t for t in self.tiers))

    @property
    def remote_tiers(self) -> tuple[Tier, ...]:
        return tuple(t for t in self.tiers if t.name != HBM)

    def store_link(self, tier: str) -> Link:
        """The link that carries HBM -> ``tier``."""
        return next(ln for ln in self.links if ln.src == HBM and ln.dst == tier)

    def fetch_link(self, tier: str) -> Link:
        """The link that carries ``tier`` -> HBM."""
        return next(ln for ln in self.links if ln.dst == HBM and ln.src == tier)

    def round_trip_key(self, tier: str) -> tuple[float, float, str]:
        """How quick a round trip (store then fetch) to ``tier`` is, quickest smallest: for a large tensor (the
        inverse bandwidths), then, between tiers that tie on it, for a small one (the latencies); the name last."""
        s, f = self.store_link(tier), self.fetch_link(tier)
        return 1 / s.bandwidth_Bps + 1 / f.bandwidth_Bps, s.latency_s + f.latency_s, tier

    def fastest_remote_tier(self) -> str:
        """The remote tier whose round trip is quickest (``round_trip_key``)."""
        return min(self.remote_tiers, key=lambda t: self.round_trip_key(t.name)).name

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tiers"] = [asdict(t) for t in self.tiers]
        d["links"] = [asdict(ln) for ln in self.links]
        return d

    @classmethod
    def from_dict(cls, d: object, source: str = "<hardware>", item: str = "hardware") -> Hardware:
        """The Hardware of a ``to_dict`` document (a schedule's ``hardware``, a ``--hardware FILE.json``).

        Strict: an unknown or missing field, or a value of the wrong type, is an InputError naming it
        (``hardware.links[1].latency_s``), so that an edited or mistyped spec is never half read.
        """
        top = _fields(d, item, source, _HARDWARE_FIELDS)
        tiers = [_fields(t, f"{item}.tiers[{i}]", source, _TIER_FIELDS) for i, t in enumerate(top["tiers"])]
        links = [_fields(ln, f"{item}.links[{i}]", source, _LINK_FIELDS) for i, ln in enumerate(top["links"])]
        sources = top.get("sources", {})
        for k, v in sources.items():
            if not isinstance(v, str):
                raise InputError(source, f"{item}.sources.{k}", f"must be text, not {v!r}")
        return cls(
            name=top["name"],
            tiers=tuple(Tier(t["name"], t["capacity_bytes"]) for t in tiers),
            links=tuple(Link(ln["name"], ln["src"], ln["dst"], float(ln["bandwidth_Bps"]),
                             float(ln.get("latency_s", 0.0)), ln.get("channels", 1)) for ln in links),
            peak_flops=float(top["peak_flops"]),
            hbm_bandwidth_Bps=float(top["hbm_bandwidth_Bps"]),
            launch_overhead_s=float(top.get("launch_overhead_s", 0.0)),
            sources=dict(sources),
        )

    def validate(self, source: str = "<hardware>") -> Hardware:
        """Return self after checking names, capacities and that every remote tier has both links."""
        names = [t.name for t in self.tiers]
        link_names = [ln.name for ln in self.links]
        if len(set(link_names)) != len(link_names):
            raise InputError(source, "hardware", "link names repeat")
        if HBM not in names:
            raise InputError(source, "hardware", "no 'hbm' tier")
        if len(set(names)) != len(names):
            raise InputError(source, "hardware", "tier names repeat")
        for t in self.tiers:
            if t.capacity_bytes <= 0:
                raise InputError(source, f"tier {t.name!r}", "capacity must be positive")
        for ln in self.links:
            if ln.bandwidth_Bps <= 0 or ln.latency_s < 0 or ln.channels < 1:
                raise InputError(source, f"link {ln.name!r}", "bandwidth must be positive, latency >= 0, channels >= 1")
            if HBM not in (ln.src, ln.dst) or ln.src == ln.dst or {ln.src, ln.dst} - set(names):
                raise InputError(source, f"link {ln.name!r}", "must join 'hbm' and a declared remote tier")
        for t in self.remote_tiers:
            for fn in (self.store_link, self.fetch_link):
                try:
                    fn(t.name)
                except StopIteration:
                    raise InputError(source, f"tier {t.name!r}", "needs a link in each direction") from None
        if self.peak_flops <= 0 or self.hbm_bandwidth_Bps <= 0:
            raise InputError(source, "hardware", "peak_flops and hbm_bandwidth must be positive")
        return self


def _pair(remote: str, down: str, up: str, bw_down: float, bw_up: float, lat: float, ch: int) -> tuple[Link, Link]:
    """A store link (HBM -> remote) named ``down`` and a fetch link (remote -> HBM) named ``up``."""
    return (
        Link(down, HBM, remote, bw_down, lat, ch),
        Link(up, remote, HBM, bw_up, lat, ch),
    )


GB = 10**9

# Every number carries its source. "assumed" marks a value we chose where no public figure was found.
PRESETS: dict[str, Hardware] = {
    "ascend-910c": Hardware(
        name="ascend-910c",
        tiers=(Tier(HBM, 64 * GB), Tier("host", 1024 * GB)),
        links=_pair("host", "d2h", "h2d", 33.6 * GB, 33.6 * GB, 10e-6, 1),
        peak_flops=376e12,
        hbm_bandwidth_Bps=1.6e12,
        launch_overhead_s=5e-6,
        sources={
            "hbm": "64 GB per die: HyperOffload (arXiv 2602.00748) peaks at 61.2 GB on one device; "
            "CloudMatrix384 (arXiv 2506.12708) gives 128 GB per dual-die Ascend 910C package",
            "d2h/h2d": "33.6 GB/s: the D2H bandwidth HyperOffload measured on its platform; H2D assumed equal",
            "peak_flops": "376 TFLOPS BF16 per die: half the ~752 TFLOPS dense BF16 reported for a 910C package",
            "hbm_bandwidth": "1.6 TB/s per die: half the 3.2 TB/s reported for a 910C package",
            "host": "1 TB host DRAM per device: assumed",
            "latency": "10 us per transfer: assumed",
            "launch_overhead": "5 us per kernel: assumed",
        },
    ),
    "cloudmatrix384": Hardware(
        name="cloudmatrix384",
        tiers=(Tier(HBM, 64 * GB), Tier("pool", 4096 * GB), Tier("host", 1024 * GB)),
        links=_pair("pool", "d2p", "p2d", 196 * GB, 196 * GB, 5e-6, 2)
        + _pair("host", "d2h", "h2d", 33.6 * GB, 33.6 * GB, 10e-6, 1),
        peak_flops=376e12,
        hbm_bandwidth_Bps=1.6e12,
        launch_overhead_s=5e-6,
        sources={
            "hbm": "64 GB per 910C die (CloudMatrix384, arXiv 2506.12708)",
            "d2p/p2d": "196 GB/s per direction per die: half of the 392 GB/s unidirectional UB bandwidth per "
            "910C package reported for CloudMatrix384; 2 channels assumed",
            "pool": "4 TB share of the disaggregated DRAM pool per device: assumed (the SuperNode pools the DRAM "
            "of its 192 Kunpeng CPUs)",
            "d2h/h2d": "33.6 GB/s: HyperOffload's measured D2H",
            "peak_flops": "376 TFLOPS BF16 per die",
            "hbm_bandwidth": "1.6 TB/s per die",
            "latency": "5 us pool, 10 us host: assumed",
        },
    ),
    "h100-pcie": Hardware(
        name="h100-pcie",
        tiers=(Tier(HBM, 80 * GB), Tier("host", 512 * GB)),
        links=_pair("host", "d2h", "h2d", 25 * GB, 25 * GB, 10e-6, 1),
        peak_flops=756e12,
        hbm_bandwidth_Bps=2.0e12,
        launch_overhead_s=4e-6,
        sources={
            "hbm": "80 GB HBM2e, 2.0 TB/s (NVIDIA H100 PCIe datasheet)",
            "peak_flops": "756 TFLOPS dense BF16 (NVIDIA H100 PCIe datasheet, 1513 with sparsity)",
            "d2h/h2d": "25 GB/s per direction: typical pinned-memory copy rate on PCIe Gen5 x16 "
            "(64 GB/s raw per direction); assumed",
            "host": "512 GB host DRAM: assumed",
            "latency": "10 us: assumed",
            "launch_overhead": "4 us: assumed",
        },
    ),
    "gh200": Hardware(
        name="gh200",
        tiers=(Tier(HBM, 96 * GB), Tier("host", 480 * GB)),
        links=_pair("host", "d2h", "h2d", 450 * GB, 450 * GB, 2e-6, 2),
        peak_flops=989e12,
        hbm_bandwidth_Bps=4.0e12,
        launch_overhead_s=4e-6,
        sources={
            "hbm": "96 GB HBM3 at 4.0 TB/s (NVIDIA GH200 datasheet)",
            "host": "480 GB LPDDR5X on the Grace CPU (NVIDIA GH200 datasheet)",
            "d2h/h2d": "450 GB/s per direction: NVLink-C2C, 900 GB/s total (NVIDIA GH200 datasheet)",
            "peak_flops": "989 TFLOPS dense BF16 (H100 SXM figure, same GPU)",
            "latency": "2 us: assumed",
            "launch_overhead": "4 us: assumed",
        },
    ),
}

DEFAULT_PRESET = "ascend-910c"


# Field -> (accepted types, required) of the documents ``Hardware.to_dict`` writes. bool is refused where int or
# float is meant (JSON ``true`` is not a capacity).
_NUMBER = (int, float)
_HARDWARE_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "name": ((str,), True), "tiers": ((list,), True), "links": ((list,), True), "peak_flops": (_NUMBER, True),
    "hbm_bandwidth_Bps": (_NUMBER, True), "launch_overhead_s": (_NUMBER, False), "sources": ((dict,), False),
}
_TIER_FIELDS = {"name": ((str,), True), "capacity_bytes": ((int,), True)}
_LINK_FIELDS = {
    "name": ((str,), True), "src": ((str,), True), "dst": ((str,), True), "bandwidth_Bps": (_NUMBER, True),
    "latency_s": (_NUMBER, False), "channels": ((int,), False),
}
_TYPE_NAMES = {str: "text", list: "a list", dict: "an object", int: "a whole number", float: "a number"}


def _fields(d: object, item: str, source: str, spec: dict[str, tuple[tuple[type, ...], bool]]) -> dict:
    """``d`` checked against ``spec``: an object with only known fields, the required ones, each of its type."""
    if not isinstance(d, dict):
        raise InputError(source, item, f"must be an object with {', '.join(spec)}")
    for key in d:
        if key not in spec:
            raise InputError(source, f"{item}.{key}", f"unknown field (known: {', '.join(spec)})")
    for key, (types, required) in spec.items():
        if key not in d:
            if required:
                raise InputError(source, f"{item}.{key}", "missing")
            continue
        v = d[key]
        if isinstance(v, bool) or not isinstance(v, types):
            raise InputError(source, f"{item}.{key}", f"must be {_TYPE_NAMES[types[-1]]}, not {v!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise InputError(source, f"{item}.{key}", f"must be finite, not {v!r}")
    return d


def load_spec(path: str) -> Hardware:
    """The Hardware of a JSON file: a ``Hardware.to_dict`` object, or a ``ho-schedule/1`` file (its ``hardware``).

    Raises InputError naming the file for a missing file, bad JSON, or a malformed or inconsistent spec.
    """

    doc = read_json(path)
    if isinstance(doc, dict) and str(doc.get("format", "")).startswith("ho-schedule/"):
        return Hardware.from_dict(doc.get("hardware"), path).validate(path)
    return Hardware.from_dict(doc, path, item="hardware").validate(path)


def is_spec_path(name: str) -> bool:
    """Whether ``--hardware NAME`` names a file rather than a preset: a JSON file name or an existing path."""
    return name not in PRESETS and (name.endswith(".json") or "/" in name or os.path.exists(name))


def preset(name: str) -> Hardware:
    """Return the named preset, or the spec in the JSON file ``name`` (``load_spec``); raise InputError listing the
    known names."""
    if is_spec_path(name):
        return load_spec(name)
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(PRESETS)
    raise InputError("command line", "--hardware",
                     f"unknown preset {name!r} (known: {known}; or a hardware spec file, NAME.json)") from None


def with_overrides(
    hw: Hardware,
    *,
    hbm: str | None = None,
    tier_capacity: dict[str, str] | None = None,
    link_bandwidth: dict[str, str] | None = None,
    link_latency: dict[str, str] | None = None,
    link_channels: dict[str, int] | None = None,
    peak_flops: str | float | None = None,
    hbm_bandwidth: str | None = None,
    launch_overhead: str | None = None,
) -> Hardware:
    """Return ``hw`` with the given fields replaced; values are parsed from text (``64GB``, ``40GB/s``)."""
    tiers = list(hw.tiers)
    caps = dict(tier_capacity or {})
    if hbm is not None:
        caps[HBM] = hbm
    for name, text in caps.items():
        idx = _index(tiers, name, "tier")
        tiers[idx] = replace(tiers[idx], capacity_bytes=parse_size(text, f"--{name}"))
    links = list(hw.links)
    for name, text in (link_bandwidth or {}).items():
        idx = _index(links, name, "link")
        links[idx] = replace(links[idx], bandwidth_Bps=parse_bandwidth(text, f"--{name}"))
    for name, text in (link_latency or {}).items():
        idx = _index(links, name, "link")
        links[idx] = replace(links[idx], latency_s=parse_time(text, f"--latency {name}"))
    for name, n in (link_channels or {}).items():
        idx = _index(links, name, "link")
        if int(n) < 1:
            raise InputError("command line", f"--channels {name}", "must be at least 1")
        links[idx] = replace(links[idx], channels=int(n))
    out = replace(hw, tiers=tuple(tiers), links=tuple(links))
    if peak_flops is not None:
        try:
            pf = float(peak_flops)
        except ValueError:
            raise InputError("command line", "--peak-flops", f"{peak_flops!r} is not a number") from None
        if pf <= 0:
            raise InputError("command line", "--peak-flops", "must be positive")
        out = replace(out, peak_flops=pf)
    if hbm_bandwidth is not None:
        out = replace(out, hbm_bandwidth_Bps=parse_bandwidth(hbm_bandwidth, "--hbm-bandwidth"))
    if launch_overhead is not None:
        out = replace(out, launch_overhead_s=parse_time(launch_overhead, "--launch-overhead"))
    return out.validate("command line")


def _index(items: list, name: str, what: str) -> int:
    for i, it in enumerate(items):
        if it.name == name:
            return i
    known = ", ".join(it.name for it in items)
    raise InputError("command line", f"--{name}", f"this hardware has no {what} {name!r} (it has: {known})")
