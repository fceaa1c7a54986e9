#!/usr/bin/env python3
"""Checks the Grafana dashboard against what the nodes expose.

Every metric name a query of deploy/grafana/fedwan-dashboard.json references
(its panels' `expr` fields and its template variables' queries) must appear
in the union of the given Prometheus text expositions. A histogram's series
(`X_bucket`, `X_sum`, `X_count`) count for X, and X for them.

Importable (test_prometheus_scrape.py uses it):

    problems = check(dashboard_path, [exposition_text, ...])

or run on files or URLs:

    check_dashboard_metrics.py DASHBOARD.json EXPOSITION_FILE_OR_URL...
"""
import json
import re
import sys
import urllib.request

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# fedwan's metrics all start with `fedwan_`; PromQL functions, keywords and
# label names never do. String literals (label values) are removed first.
_METRIC_RE = re.compile(r"\bfedwan_[A-Za-z0-9_]*[A-Za-z0-9]")
_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_SAMPLE_RE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{|\s)")
_TYPE_RE = re.compile(r"^#\s+TYPE\s+([A-Za-z_:][A-Za-z0-9_:]*)\s+(\S+)")


def load_dashboard(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _walk(node):
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def dashboard_queries(dashboard):
    """(where, query) for every panel target's expr and every query variable."""
    out = []
    for panel in _walk(dashboard.get("panels", [])):
        for t in panel.get("targets", []) if isinstance(panel.get("targets"), list) else []:
            if isinstance(t, dict) and isinstance(t.get("expr"), str) and t["expr"].strip():
                out.append((f"panel '{panel.get('title', '?')}' {t.get('refId', '?')}", t["expr"]))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        q = var.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if isinstance(q, str) and q.strip():
            out.append((f"variable '{var.get('name', '?')}'", q))
    return out


def referenced_metrics(query):
    return set(_METRIC_RE.findall(_STRING_RE.sub('""', query)))


def exposed_metrics(texts):
    """Metric names in the expositions: every sample's name, and every family a
    TYPE line declares (a labelled family may have no sample yet), with the
    histogram and summary families also under their series' names."""
    names = set()
    for text in texts:
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            m = _TYPE_RE.match(line)
            if m:
                names.add(m.group(1))
                if m.group(2) in ("histogram", "summary"):
                    names.update(m.group(1) + s for s in HISTOGRAM_SUFFIXES)
                continue
            if line.startswith("#"):
                continue
            m = _SAMPLE_RE.match(line)
            if m:
                names.add(m.group(1))
    return names


def sampled_metrics(texts):
    """Names that have at least one sample line."""
    names = set()
    for text in texts:
        for line in text.splitlines():
            m = _SAMPLE_RE.match(line.strip())
            if m and not line.lstrip().startswith("#"):
                names.add(m.group(1))
    return names


def _present(name, names):
    if name in names:
        return True
    for s in HISTOGRAM_SUFFIXES:
        if name.endswith(s) and name[: -len(s)] in names:
            return True
    return False


def check_structure(dashboard):
    """The shape the deployment relies on: a datasource variable, a node
    variable from fedwan_info, every query on that datasource."""
    problems = []
    variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
    ds = variables.get("DS_PROMETHEUS")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.append("no 'DS_PROMETHEUS' datasource variable of type prometheus")
    node = variables.get("node")
    q = node.get("query") if node else None
    if isinstance(q, dict):
        q = q.get("query")
    if not node or (q or "").replace(" ", "") != "label_values(fedwan_info,node)":
        problems.append("no 'node' variable from label_values(fedwan_info, node)")
    for panel in _walk(dashboard.get("panels", [])):
        if "targets" not in panel:
            continue
        for t in panel["targets"]:
            uid = (t.get("datasource") or panel.get("datasource") or {}).get("uid")
            if uid != "${DS_PROMETHEUS}":
                problems.append(f"panel '{panel.get('title')}' {t.get('refId')} queries "
                                f"datasource {uid!r}, not ${{DS_PROMETHEUS}}")
    if not isinstance(dashboard.get("schemaVersion"), int):
        problems.append("no schemaVersion")
    return problems


def check(dashboard_path, texts):
    """Problems (strings); empty when every referenced metric is exposed."""
    dashboard = load_dashboard(dashboard_path)
    problems = check_structure(dashboard)
    names = exposed_metrics(texts)
    queries = dashboard_queries(dashboard)
    if not queries:
        problems.append(f"{dashboard_path}: no queries found")
    missing = {}
    for where, q in queries:
        refs = referenced_metrics(q)
        if not refs:
            problems.append(f"{where}: references no fedwan metric: {q}")
        for name in sorted(refs):
            if not _present(name, names):
                missing.setdefault(name, []).append(where)
    for name, wheres in sorted(missing.items()):
        problems.append(f"metric '{name}' (used by {', '.join(wheres)}) is in no node's "
                        f"/metrics exposition")
    return problems


def all_referenced(dashboard_path):
    refs = set()
    for _, q in dashboard_queries(load_dashboard(dashboard_path)):
        refs |= referenced_metrics(q)
    return refs


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    texts = []
    for src in argv[1:]:
        if src.startswith(("http://", "https://")):
            with urllib.request.urlopen(src, timeout=10) as r:
                texts.append(r.read().decode("utf-8"))
        else:
            with open(src, encoding="utf-8") as f:
                texts.append(f.read())
    problems = check(argv[0], texts)
    for p in problems:
        print("FAIL:", p)
    if not problems:
        print(f"ok: the {len(all_referenced(argv[0]))} metrics the dashboard uses are exposed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
