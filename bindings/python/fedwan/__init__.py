"""fedwan: cross-site federated training from Python.

The compiled core (``fedwan._fedwan``) is torch-free; arrays cross the boundary
as NumPy views. This package re-exports it and adds :class:`Site`, which joins a
torch model to a federation by sharing its parameter memory with the runtime.

Codecs and :class:`Topology` need only NumPy; :class:`Site` needs torch (any
version; it is imported when a Site is built).

Links between nodes are mutual TLS 1.3 with AEAD frames. Provision the
federation's identities once (a CA and one bundle per node), then give each
node its own bundle::

    import fedwan
    fedwan.provision_credentials("federation.yaml", "pki")   # pki/ca: keep offline
    creds = fedwan.credentials_path("pki", "site-eu-1")      # ship pki/site-eu-1 only

A site's training loop::

    import torch
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with fedwan.Site(model, opt, topology="federation.yaml", node_id="site-eu-1",
                     credentials=creds) as site:  # joined: `model` holds the federation's
        while not site.finished:
            loss = ...; loss.backward(); opt.step(); opt.zero_grad()
            site.step()           # every H-th call syncs with the federation

A site of several ranks (DDP under torch.distributed) passes
``process_group=torch.distributed.group.WORLD`` on every rank: rank 0 talks to
the federation and broadcasts each model over the group.

The root (or a region) runs an :class:`Aggregator`::

    with fedwan.Aggregator("federation.yaml", "root", initial_model=site_flat_numpy,
                           credentials=fedwan.credentials_path("pki", "root")) as agg:
        summary = agg.run()       # blocks until the last round; GIL released
    # leaving the block closed it: its endpoint is free again
"""

from . import _fedwan
from ._fedwan import (
    Aggregator,
    ConfigError,
    CryptoError,
    Error,
    FederationSpec,
    NodeSpec,
    OuterOptimizerSpec,
    PrivacyAccountant,
    ProtocolError,
    SiteCore,
    StoppedError,
    Topology,
    TimeoutError,
    TransportError,
    codec_names,
    credentials_path,
    decode,
    encode,
    encoded_size,
    noise_multiplier_for,
    privacy_epsilon,
    privacy_rounds_within,
    provision_credentials,
    synthetic_initial_model,
    synthetic_local_steps,
    synthetic_targets,
    validate,
)
from .site import Site

__version__ = _fedwan.__version__

__all__ = [
    "Aggregator",
    "ConfigError",
    "CryptoError",
    "Error",
    "FederationSpec",
    "NodeSpec",
    "OuterOptimizerSpec",
    "PrivacyAccountant",
    "ProtocolError",
    "Site",
    "SiteCore",
    "StoppedError",
    "Topology",
    "TimeoutError",
    "TransportError",
    "codec_names",
    "credentials_path",
    "decode",
    "encode",
    "encoded_size",
    "noise_multiplier_for",
    "privacy_epsilon",
    "privacy_rounds_within",
    "provision_credentials",
    "synthetic_initial_model",
    "synthetic_local_steps",
    "synthetic_targets",
    "validate",
]

# Tracebacks and reprs name the public package, not the extension module.
for _name in __all__:
    _obj = globals().get(_name)
    if isinstance(_obj, type):
        try:
            _obj.__module__ = __name__
        except (AttributeError, TypeError):
            pass
del _name, _obj
