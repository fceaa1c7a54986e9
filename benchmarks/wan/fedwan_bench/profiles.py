"""WAN profiles: what each tier of the tree runs over.

A profile names the link between a region and the root (the WAN proper)
and the link between a site and its region. The figures of the four named
profiles are those docs/benchmarks.md lists; `custom()` builds one from
flags.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Optional


@dataclass(frozen=True)
class Link:
    rate_mbit: float  # 0 = unlimited
    delay_ms: float  # one way
    jitter_ms: float = 0.0
    loss_percent: float = 0.0
    duplicate_percent: float = 0.0
    reorder_percent: float = 0.0

    def emulator_profile(self) -> dict:
        """The fedwan-linkemu profile object (its JSON keys)."""
        return {k: v for k, v in asdict(self).items()}

    def describe(self) -> str:
        rate = f"{self.rate_mbit / 1000:g} Gbit/s" if self.rate_mbit >= 1000 else \
            f"{self.rate_mbit:g} Mbit/s"
        text = f"{rate}, {self.delay_ms:g} ms"
        if self.jitter_ms:
            text += f" +/- {self.jitter_ms:g} ms"
        if self.loss_percent:
            text += f", {self.loss_percent:g}% loss"
        if self.duplicate_percent:
            text += f", {self.duplicate_percent:g}% duplicated"
        if self.reorder_percent:
            text += f", {self.reorder_percent:g}% reordered"
        return text


@dataclass(frozen=True)
class Profile:
    name: str
    root_link: Link  # region <-> root, and site <-> root in a flat tree
    site_link: Link  # site <-> region

    def to_json(self) -> dict:
        return {"name": self.name, "root_link": asdict(self.root_link),
                "site_link": asdict(self.site_link),
                "root_link_text": self.root_link.describe(),
                "site_link_text": self.site_link.describe()}


# A site reaches its region's aggregator over a regional network: fast and
# near, so the WAN between regions and the root is the bottleneck.
_REGIONAL = Link(rate_mbit=1000, delay_ms=2)

PROFILES = {
    "lan": Profile("lan", Link(10_000, 0.1), Link(10_000, 0.1)),
    "cross-region": Profile("cross-region", Link(1000, 15), _REGIONAL),
    "intercontinental": Profile("intercontinental", Link(200, 40, loss_percent=0.1), _REGIONAL),
    "degraded": Profile("degraded", Link(50, 75, jitter_ms=25, loss_percent=1), _REGIONAL),
}


def named(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile '{name}'; one of {', '.join(PROFILES)} or custom") \
            from None


def custom(base: Optional[Profile] = None, *, rate_mbit: Optional[float] = None,
           delay_ms: Optional[float] = None, jitter_ms: Optional[float] = None,
           loss_percent: Optional[float] = None, site_rate_mbit: Optional[float] = None,
           site_delay_ms: Optional[float] = None) -> Profile:
    """A profile from flags, over `base` (default: cross-region)."""
    base = base or PROFILES["cross-region"]
    root = base.root_link
    changes = {k: v for k, v in dict(rate_mbit=rate_mbit, delay_ms=delay_ms, jitter_ms=jitter_ms,
                                      loss_percent=loss_percent).items() if v is not None}
    root = replace(root, **changes)
    site = base.site_link
    if site_rate_mbit is not None:
        site = replace(site, rate_mbit=site_rate_mbit)
    if site_delay_ms is not None:
        site = replace(site, delay_ms=site_delay_ms)
    name = base.name if not changes and site is base.site_link else "custom"
    return Profile(name, root, site)
