#!/bin/sh
# Init container of every node (root, with CAP_CHOWN only): copies the node's
# Secrets, mounted here alone (root's files, mode 0400), into the in-memory
# volumes the node mounts, as files of the node's uid (FEDWAN_UID, default
# 10001), mode 0400, in directories of mode 0500. The node reads its key and
# its metrics token there; no group and no other user can. A Secret replaced
# later reaches the node when its pod starts again; the CRL, linked to the
# ConfigMap fedwan-crl (FEDWAN_CRL_LINK), while it runs.
set -eu
uid="${FEDWAN_UID:-10001}"
umask 077
copy() {
  src=$1 dst=$2
  for f in "$src"/*; do
    [ -f "$f" ] || continue  # the Secret's keys, not its ..data links
    name=$(basename "$f")
    cat "$f" >"$dst/$name"
    chmod 0400 "$dst/$name"
    chown "$uid:$uid" "$dst/$name"
  done
  if [ "$dst" = /etc/fedwan/credentials ] && [ -n "${FEDWAN_CRL_LINK:-}" ]; then
    # The CRL is public and replaced in place: crl.pem links to the
    # ConfigMap fedwan-crl that the node's container mounts, so that a new
    # CRL reaches the running node (it reads crl.pem again when its content
    # changes), where the Secret's copy would only at the next start.
    rm -f "$dst/crl.pem"
    ln -s "$FEDWAN_CRL_LINK" "$dst/crl.pem"
    chown -h "$uid:$uid" "$dst/crl.pem"
  fi
  chmod 0500 "$dst"
  chown "$uid:$uid" "$dst"
}
copy /secrets/credentials /etc/fedwan/credentials
copy /secrets/metrics-token /etc/fedwan/metrics-token
