#!/usr/bin/env python3
"""Checks the Kubernetes manifests in deploy/kubernetes hold together.

Every file parses as YAML; every pod template mounts only volumes it
declares; every Secret volume has defaultMode 0400 and is mounted by init
containers only (the node reads copies of its own uid, see
launch/credentials.sh); crl.pem links into the ConfigMap fedwan-crl that
the node's container mounts; every node serves metrics with a token; the
NetworkPolicies are listed in kustomization.yaml and deny by default.
Usage: check_kubernetes.py [SOURCE_DIR]; exits 1 naming every problem.
"""
import pathlib
import sys

import yaml


def pod_specs(doc):
    """Each pod template of a workload, and the names of its claim templates."""
    spec = (doc or {}).get("spec", {})
    template = spec.get("template")
    if template:
        claims = {c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])}
        yield template.get("spec", {}), claims


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".") / "deploy/kubernetes"
    problems = []
    docs = {}
    for path in sorted(root.glob("*.yaml")):
        try:
            docs[path.name] = [d for d in yaml.safe_load_all(path.read_text()) if d]
        except yaml.YAMLError as e:
            problems.append(f"{path}: not YAML: {e}")
    kustomization = docs.get("kustomization.yaml", [{}])[0]
    for name in kustomization.get("resources", []):
        if name not in docs:
            problems.append(f"kustomization.yaml lists {name}, which is not there")
    if "networkpolicy.yaml" not in kustomization.get("resources", []):
        problems.append("kustomization.yaml does not list networkpolicy.yaml")
    policies = [d for d in docs.get("networkpolicy.yaml", []) if d.get("kind") == "NetworkPolicy"]
    if not any(p["spec"].get("podSelector") == {} and "ingress" not in p["spec"]
               for p in policies):
        problems.append("networkpolicy.yaml has no default-deny ingress policy")
    for fname, items in docs.items():
        for doc in items:
            for pod, claims in pod_specs(doc):
                where = f"{fname} ({doc.get('kind')} {doc['metadata']['name']})"
                volumes = {v["name"]: v for v in pod.get("volumes", [])}
                inits = pod.get("initContainers", [])
                for c in inits + pod.get("containers", []):
                    for m in c.get("volumeMounts", []):
                        if m["name"] in claims:
                            continue
                        if m["name"] not in volumes:
                            problems.append(f"{where}: {c['name']} mounts undeclared {m['name']}")
                        elif "secret" in volumes[m["name"]] and c not in inits:
                            problems.append(f"{where}: {c['name']} mounts Secret volume "
                                            f"{m['name']} itself (mount the init copy)")
                for v in volumes.values():
                    if "secret" in v and v["secret"].get("defaultMode") != 0o400:
                        problems.append(f"{where}: Secret volume {v['name']} is not "
                                        "defaultMode 0400")
                for c in pod.get("containers", []):
                    env = {e["name"]: e.get("value") for e in c.get("env", [])}
                    if env.get("FEDWAN_METRICS") and not env.get("FEDWAN_METRICS_TOKEN_FILE"):
                        problems.append(f"{where}: metrics served without a token")
                # The CRL reaches a running node: crl.pem links into the
                # ConfigMap fedwan-crl, which the node's container mounts.
                links = {e.get("value") for c in inits for e in c.get("env", [])
                         if e["name"] == "FEDWAN_CRL_LINK"}
                if inits and len(links) != 1:
                    problems.append(f"{where}: the init container sets no FEDWAN_CRL_LINK")
                for c in pod.get("containers", []):
                    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
                    crl = [m for n, m in mounts.items()
                           if volumes.get(n, {}).get("configMap", {}).get("name") == "fedwan-crl"]
                    if inits and not crl:
                        problems.append(f"{where}: {c['name']} does not mount the ConfigMap "
                                        "fedwan-crl")
                    elif inits and links and not all(
                            (link or "").startswith(crl[0]["mountPath"].rstrip("/") + "/")
                            for link in links):
                        problems.append(f"{where}: FEDWAN_CRL_LINK {sorted(links)} is not in "
                                        f"{crl[0]['mountPath']}")
    for p in problems:
        print(p)
    if not problems:
        print(f"kubernetes: {len(docs)} files, manifests hold together")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
