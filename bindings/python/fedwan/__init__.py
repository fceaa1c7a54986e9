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
    site = fedwan.Site("federation.yaml", "site-eu-1", model.parameters(),
                       credentials=creds)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)   # after Site: same tensors
    site.join()                   # loads the federation's model into `model`
    while not site.finished:
        loss = ...; loss.backward(); opt.step(); opt.zero_grad()
        site.step()               # every H-th call syncs with the federation

The root (or a region) runs an :class:`Aggregator`::

    agg = fedwan.Aggregator("federation.yaml", "root", initial_model=site_flat_numpy,
                            credentials=fedwan.credentials_path("pki", "root"))
    summary = agg.run()           # blocks until the last round; GIL released
"""

import os as _os

from . import _fedwan
from ._fedwan import (
    Aggregator,
    ConfigError,
    CryptoError,
    Error,
    FederationSpec,
    NodeSpec,
    OuterOptimizerSpec,
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
    provision_credentials,
    synthetic_initial_model,
    synthetic_local_steps,
    synthetic_targets,
    validate,
)

__version__ = _fedwan.__version__

__all__ = [
    "Aggregator",
    "ConfigError",
    "CryptoError",
    "Error",
    "FederationSpec",
    "NodeSpec",
    "OuterOptimizerSpec",
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


def _flatten_into_one_buffer(torch, tensors):
    """Copies ``tensors`` into one new contiguous fp32 CPU buffer and re-points
    each tensor's ``.data`` at its slice. Returns the buffer."""
    total = sum(t.numel() for t in tensors)
    flat = torch.empty(total, dtype=torch.float32)
    with torch.no_grad():
        offset = 0
        for t in tensors:
            n = t.numel()
            view = flat[offset:offset + n]
            view.copy_(t.detach().reshape(-1))
            t.data = view.view_as(t)
            offset += n
    return flat


class Site:
    """A site of the federation over the parameters of a torch model.

    ``Site(topology, node_id, parameters)`` copies ``parameters`` (e.g.
    ``model.parameters()``: fp32 CPU tensors) into ONE contiguous fp32 buffer
    and re-points every parameter at its slice, so the model, its optimizer
    and fedwan share memory: whatever the optimizer writes is what fedwan
    sends, and what fedwan receives is what the model computes with next.
    Build the optimizer before or after; it keeps the same Parameter objects.
    Do not replace a parameter's ``.data`` afterwards, or it leaves the buffer.

    ``topology`` is a :class:`Topology` or the path of a topology file.
    ``join_timeout_s`` bounds :meth:`join`; ``round_timeout_s`` bounds each
    :meth:`sync` (None: the topology's ``federation.round_timeout_s``).

    Security (keyword-only): ``credentials`` is this site's bundle directory,
    ``credentials_path(dir, node_id)`` after :func:`provision_credentials`;
    the link to the parent is then mutual TLS 1.3 with ``cipher``
    (``"aes-256-gcm"`` or ``"chacha20-poly1305"``) on every frame.
    ``insecure_plaintext=True`` runs without either, for loopback
    experiments; secure parents refuse such a site. ``audit_log`` is a path
    for a hash-chained JSONL log of this site's handshakes and updates.

    Fault tolerance: ``checkpoint_dir`` (keyword-only) makes the site write a
    checkpoint there at every round boundary (parameters, anchor,
    error-feedback residual, round) and resume from it in :meth:`join` after
    a restart. :meth:`step` keeps the link alive (heartbeats, reconnects)
    between syncs.

    Raises :class:`ConfigError` for a parameter that is not fp32, not on the
    CPU, or not a tensor, for no parameters at all, for a node that is not a
    site of the topology, and for neither credentials nor
    ``insecure_plaintext`` (or both).

    Thread safety: one thread drives a Site. :meth:`join` and :meth:`sync`
    block on the network with the GIL released, so several sites can run in
    threads of one process. Ctrl-C while they wait stops the site and raises
    ``KeyboardInterrupt`` within a second; :meth:`stop` from another thread
    makes them raise :class:`StoppedError`.
    """

    def __init__(self, topology, node_id, parameters, join_timeout_s=300.0,
                 round_timeout_s=None, window=8, *, credentials=None,
                 insecure_plaintext=False, cipher="aes-256-gcm", audit_log=None,
                 checkpoint_dir=None):
        import torch

        tensors = []
        seen = set()
        for i, p in enumerate(parameters):
            if not isinstance(p, torch.Tensor):
                raise ConfigError(
                    f"parameter {i} is a {type(p).__name__}, not a torch tensor; "
                    "pass model.parameters()")
            if p.dtype != torch.float32:
                raise ConfigError(
                    f"parameter {i} (shape {tuple(p.shape)}) is {p.dtype}; fedwan sites "
                    "train fp32 parameters: call model.float() first")
            if p.layout != torch.strided:
                raise ConfigError(
                    f"parameter {i} has layout {p.layout}; fedwan.Site needs dense tensors")
            if p.device.type != "cpu":
                raise ConfigError(
                    f"parameter {i} (shape {tuple(p.shape)}) is on {p.device}; "
                    "fedwan.Site shares memory with CPU tensors only: call model.cpu() first")
            if id(p) not in seen:  # a tied parameter appears once
                seen.add(id(p))
                tensors.append(p)
        if not tensors:
            raise ConfigError("fedwan.Site needs at least one parameter tensor")
        if isinstance(topology, (str, _os.PathLike)):
            topology = Topology.load(topology)

        self._tensors = tensors
        self._flat = _flatten_into_one_buffer(torch, tensors)
        # A zero-copy NumPy view of the buffer; SiteCore writes through it.
        self._array = self._flat.numpy()
        self._core = SiteCore(topology, node_id, self._array,
                              join_timeout_s=join_timeout_s,
                              round_timeout_s=round_timeout_s, window=window,
                              credentials=credentials,
                              insecure_plaintext=insecure_plaintext, cipher=cipher,
                              audit_log=audit_log, checkpoint_dir=checkpoint_dir)
        self._node_id = node_id
        self._steps_in_round = 0

    def join(self):
        """Connects and joins the federation; afterwards the parameters hold
        the federation's model for the current round. Returns the result dict
        ``{round, finished, bytes_sent, bytes_received}``."""
        self._steps_in_round = 0
        return self._core.join()

    def step(self):
        """Counts one inner step. Every ``inner_steps``-th call ends the round
        with :meth:`sync` (blocking) and returns its result dict; otherwise
        returns None. Between syncs it services the link (heartbeats,
        reconnects); if the parent resynced this site, the parameters now
        hold its model, the round's count restarts and the result dict (with
        ``resynced=True``) is returned."""
        serviced = self._core.service()
        if serviced["resynced"]:
            self._steps_in_round = 0
            return serviced
        self._steps_in_round += 1
        if self._steps_in_round < self._core.inner_steps:
            return None
        return self.sync()

    def sync(self):
        """Ends the round now, whatever the step count: sends this site's
        pseudo-gradient, waits for the next global model and loads it into
        the parameters. Returns ``{round, finished, bytes_sent,
        bytes_received}``."""
        self._steps_in_round = 0
        return self._core.sync()

    def checkpoint(self):
        '''Writes a checkpoint of the current state to ``checkpoint_dir`` now
        (for a SIGTERM handler); a no-op without one.'''
        self._core.checkpoint()

    def stop(self):
        '''Makes a ``join()``, ``step()`` or ``sync()`` blocked in another
        thread (or a signal handler's caller) raise :class:`StoppedError`
        within about 100 ms; every later one raises it too.'''
        self._core.stop()

    @property
    def finished(self):
        """True once the federation is done; the parameters hold its final model."""
        return self._core.finished

    @property
    def round(self):
        """The round this site trains in."""
        return self._core.round

    @property
    def inner_steps(self):
        """H: the inner steps per round, from the topology."""
        return self._core.inner_steps

    @property
    def alarms(self):
        """What the site rode out that an operator must act on ('kind: message')."""
        return self._core.alarms

    @property
    def flat(self):
        """The contiguous fp32 torch buffer every parameter is a view of."""
        return self._flat

    @property
    def numel(self):
        """Number of parameters (elements) the site federates."""
        return self._flat.numel()

    @property
    def parameters(self):
        """The federated tensors, in buffer order."""
        return list(self._tensors)

    @property
    def node_id(self):
        return self._node_id

    def __repr__(self):
        return (f"Site(node_id={self._node_id!r}, numel={self.numel}, "
                f"round={self.round}, finished={self.finished})")
