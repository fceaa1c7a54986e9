#!/usr/bin/env python3
"""Checks that no include runs upward between the library's folders.

The layers, lowest first, are the table in docs/architecture.md ("Layers").
A file may include headers of its own folder and of any lower layer; folders
on the same layer (the roles) may not include each other. Public headers
(include/fedwan/*.hpp) belong to the layer of the folder that implements
them. Usage: check_layering.py [SOURCE_DIR]; exits 1 and names every
offending include.
"""
import pathlib
import re
import sys

# Lowest first. Folders in one tuple are siblings: neither sees the other.
LAYERS = [
    ("common",),
    ("metrics",),
    ("tensor",),
    ("codec",),
    ("wire",),
    ("privacy",),
    ("aggregation",),
    ("topology",),
    ("security",),
    ("transport",),
    ("node", "costs"),
    ("checkpoint",),
    ("session",),
    ("site", "aggregator", "comm", "workload"),
    ("cuda",),
    ("torch",),
    ("cli",),
]

# include/fedwan/<header>: the folder it belongs to.
PUBLIC = {
    "error.hpp": "common",
    "export.hpp": "common",  # FEDWAN_API: visibility, used by every layer
    "codec.hpp": "codec",
    "outer_optimizer.hpp": "aggregation",
    "privacy.hpp": "privacy",
    "topology.hpp": "topology",
    "security.hpp": "security",
    "node_options.hpp": "node",  # NodeOptions: the base of SiteOptions, AggregatorOptions
    "site_core.hpp": "site",
    "aggregator.hpp": "aggregator",
    "site_comm.hpp": "comm",
    "synthetic.hpp": "workload",
    "cuda.hpp": "cuda",
    "config.h": "common",  # generated: version and build options
    "flat_parameters.hpp": "torch",
    "site.hpp": "torch",
    "data_parallel.hpp": "torch",
}

RANK = {folder: i for i, group in enumerate(LAYERS) for folder in group}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of_include(path: str, including: str) -> str | None:
    parts = path.split("/")
    if parts[0] == "fedwan" and len(parts) == 2:
        return PUBLIC.get(parts[1], "?" + parts[1])
    if len(parts) >= 2 and parts[0] in RANK:
        return parts[0]
    if len(parts) == 1:
        return including  # same folder, by relative name (cuda/)
    return None  # a third-party or generated header


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    files = []
    for folder in RANK:
        base = root / ("cuda" if folder == "cuda" else "src/" + folder)
        if base.is_dir():
            files += [(folder, p) for p in sorted(base.rglob("*")) if p.suffix in
                      (".cpp", ".hpp", ".h", ".cu", ".cuh")]
    for p in sorted((root / "include/fedwan").glob("*.hpp")):
        if p.name not in PUBLIC:
            print(f"{p}: public header missing from the layer map in {__file__}")
            return 1
        files.append((PUBLIC[p.name], p))
    unknown = [d.name for d in (root / "src").iterdir() if d.is_dir() and d.name not in RANK]
    bad = [f"src/{d}: a folder with no layer (add it to LAYERS and docs/architecture.md)"
           for d in unknown]
    for folder, p in files:
        for inc in INCLUDE.findall(p.read_text(encoding="utf-8", errors="replace")):
            target = folder_of_include(inc, folder)
            if target is None or target == folder:
                continue
            if target.startswith("?") or target not in RANK:
                bad.append(f"{p.relative_to(root)}: includes \"{inc}\", which has no layer")
            elif RANK[target] >= RANK[folder]:
                how = "a sibling" if RANK[target] == RANK[folder] else "a higher layer"
                bad.append(f"{p.relative_to(root)}: includes \"{inc}\" from {how} "
                           f"({folder} may use only lower layers, {target} is not one)")
    for line in bad:
        print(line)
    if bad:
        print(f"{len(bad)} include(s) against the layering of docs/architecture.md")
        return 1
    print(f"layering: {len(files)} files, no include runs upward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
