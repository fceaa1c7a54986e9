"""fedwan.Site: a torch model's parameters joined to a federation.

One process, or the ranks of one torch.distributed process group: rank 0 of
the group (the leader) holds the link to the federation; the others receive
every model it loads over the group's own backend.
"""

import os
from typing import Any, Dict, Iterable, List, Literal, Optional

from ._fedwan import ConfigError, Error, SiteCore, Topology

# The status a leader broadcasts to its ranks after each call, as int64:
# ok, round, finished, resynced, inner_steps, bytes_sent, bytes_received,
# bytes_resent.
_STATUS_FIELDS = 8
# The leader's error message travels in a fixed-size byte tensor.
_MESSAGE_BYTES = 1024


def _as_tensors(torch, parameters) -> List[Any]:
    """Checks `parameters` (an nn.Module or an iterable of tensors) and
    returns the distinct tensors in order (a tied parameter once)."""
    if isinstance(parameters, torch.nn.Module):
        parameters = parameters.parameters()
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    try:
        items = list(parameters)
    except TypeError:
        raise ConfigError(
            f"fedwan.Site needs a torch.nn.Module or an iterable of parameters, got "
            f"{type(parameters).__name__}") from None
    tensors, seen = [], set()
    for i, p in enumerate(items):
        if not isinstance(p, torch.Tensor):
            raise ConfigError(
                f"parameter {i} is a {type(p).__name__}, not a torch tensor; "
                "pass the model or model.parameters()")
        if p.dtype != torch.float32:
            raise ConfigError(
                f"parameter {i} (shape {tuple(p.shape)}) is {p.dtype}; fedwan sites "
                "train fp32 parameters: call model.float() first")
        if p.layout != torch.strided:
            raise ConfigError(
                f"parameter {i} has layout {p.layout}; fedwan.Site needs dense tensors")
        if p.device.type == "meta":
            raise ConfigError(
                f"parameter {i} (shape {tuple(p.shape)}) is on meta; fedwan.Site needs "
                "parameters with storage (CPU tensors only, or CUDA ones it mirrors)")
        if id(p) not in seen:
            seen.add(id(p))
            tensors.append(p)
    if not tensors:
        raise ConfigError("fedwan.Site needs at least one parameter tensor")
    return tensors


def _check_optimizer(torch, optimizer, tensors) -> None:
    """An optimizer built over other tensors than the site's (a copy of the
    model, another model) would train what fedwan never sends."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(
            f"optimizer is a {type(optimizer).__name__}, not a torch.optim.Optimizer")
    ours = {id(t) for t in tensors}
    for g, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            if id(p) not in ours:
                raise ConfigError(
                    f"the optimizer's parameter group {g} holds a tensor of shape "
                    f"{tuple(p.shape)} that is not one of the site's parameters; build the "
                    "optimizer over the same model's parameters")


def _flatten_into_one_buffer(torch, tensors):
    """Copies `tensors` (CPU) into one new contiguous fp32 buffer and
    re-points each tensor's ``.data`` at its slice. Returns the buffer."""
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


def _can_share(tensors) -> bool:
    """Whether the runtime can work on the parameters' own memory (CPU),
    rather than on a CPU mirror copied around each call (GPU)."""
    return all(t.device.type == "cpu" for t in tensors)


def _global_rank(dist, group, group_rank: int) -> int:
    """The global rank of `group_rank` in `group` (collectives take global
    ranks as src), across torch 1.13 and 2.x."""
    if group is None or group is dist.group.WORLD:
        return group_rank
    get = getattr(dist, "get_global_rank", None) or \
        getattr(dist.distributed_c10d, "_get_global_rank")
    return get(group, group_rank)


class Site:
    """A site of the federation over the parameters of a torch model.

    ``Site(model, optimizer=None, *, topology, node_id, credentials, ...)``;
    ``model`` is an ``nn.Module`` or an iterable of its parameters. The
    older positional form ``Site(topology, node_id, parameters, ...)`` is
    the same.

    CPU parameters are copied into ONE contiguous fp32 buffer and every
    parameter is re-pointed at its slice, so the model, its optimizer and
    fedwan share memory: whatever the optimizer writes is what fedwan sends,
    and what fedwan receives is what the model computes with next. Do not
    replace a parameter's ``.data`` afterwards, or it leaves the buffer.
    Parameters on a GPU stay where they are: the site mirrors them into a
    CPU buffer before each sync and copies the new model back after it.

    ``optimizer`` (optional) is checked to hold only the site's parameters,
    so that it cannot train a copy fedwan never sends. It keeps its state
    (momentum, Adam moments) across rounds, as DiLoCo's inner optimizer does.

    As a context manager the site joins on entry (the model then holds the
    federation's model) and closes its link on exit; an exception leaving
    the block writes a checkpoint first when ``checkpoint_dir`` is set::

        with fedwan.Site(model, opt, topology="federation.yaml",
                         node_id="site-eu-1", credentials=creds) as site:
            while not site.finished:
                loss = ...; loss.backward(); opt.step(); opt.zero_grad()
                site.step()     # every H-th call syncs with the federation

    ``topology`` is a :class:`Topology` or the path of a topology file.
    ``join_timeout_s`` bounds :meth:`join`; ``round_timeout_s`` bounds each
    :meth:`sync` (None: the topology's ``federation.round_timeout_s``).

    Security: ``credentials`` is this site's bundle directory,
    ``credentials_path(dir, node_id)`` after :func:`provision_credentials`;
    the link to the parent is then mutual TLS 1.3 with ``cipher``
    (``"aes-256-gcm"`` or ``"chacha20-poly1305"``) on every frame.
    ``insecure_plaintext=True`` runs without either, for loopback
    experiments; secure parents refuse such a site. ``audit_log`` is a path
    for a hash-chained JSONL log of this site's handshakes and updates.

    Fault tolerance: ``checkpoint_dir`` makes the site write a checkpoint
    there at every round boundary (parameters, anchor, error-feedback
    residual, round) and resume from it in :meth:`join` after a restart.
    :meth:`step` keeps the link alive (heartbeats, reconnects) between syncs.

    Overlapped rounds: with ``federation.overlap_steps`` = tau > 0 in the
    topology, the ``inner_steps``-th :meth:`step` of a round sends the update
    without waiting (:meth:`SiteCore.begin_sync`): training goes on while it
    goes up and the next model comes down, and tau steps later :meth:`step`
    merges that model (:meth:`SiteCore.finish_sync`, waiting for it only if
    it is late), keeping the progress made meanwhile:
    ``params += new model - params when the update was sent``. The round's
    count runs from the update, so updates stay ``inner_steps`` apart. The
    last round's update is merged at once: the final model replaces any
    later steps.

    Several ranks (``process_group``): a site whose ranks train one model
    under ``torch.distributed`` (DDP inside the site, any backend) passes
    its process group (``torch.distributed.group.WORLD`` for all ranks) on
    every rank. Rank 0 of the group is the leader: only it connects to the
    federation (only it needs ``credentials``, ``audit_log`` and
    ``checkpoint_dir``); after every :meth:`join`, :meth:`sync`, resync and
    overlapped merge it broadcasts the model over the group, so every rank
    holds the same parameters, and :meth:`step` is a collective (every rank
    calls it the same number of times, as DDP's backward already requires;
    every rank sends and merges at the same step). An error on
    the leader raises :class:`Error` on the other ranks too, naming it. The
    group's timeout (``init_process_group(timeout=...)``) must exceed the
    round timeout: the other ranks wait in a broadcast while the leader
    waits for the federation.

    Raises :class:`ConfigError` for a parameter that is not fp32 or not a
    tensor, for no parameters at all, for an optimizer over other tensors,
    for a node that is not a site of the topology, and for neither
    credentials nor ``insecure_plaintext`` (or both) on the leader.

    Thread safety: one thread drives a Site. :meth:`join` and :meth:`sync`
    block on the network with the GIL released, so several sites can run in
    threads of one process. Ctrl-C while they wait stops the site and raises
    ``KeyboardInterrupt`` within a second; :meth:`stop` from another thread
    makes them raise :class:`StoppedError`.
    """

    def __init__(self, model, optimizer=None, parameters=None, join_timeout_s: float = 300.0,
                 round_timeout_s: Optional[float] = None, window: int = 4, *,
                 topology=None, node_id: Optional[str] = None, credentials=None,
                 insecure_plaintext: bool = False, cipher: str = "aes-256-gcm",
                 audit_log=None, checkpoint_dir=None, process_group=None,
                 costs_path=None, metrics: str = "", metrics_token_file=None):
        import torch

        if isinstance(model, (str, os.PathLike, Topology)):
            # Site(topology, node_id, parameters, ...)
            if topology is not None or node_id is not None:
                raise ConfigError(
                    "fedwan.Site: give the topology and node_id either first and second "
                    "(Site(topology, node_id, parameters)) or as keywords "
                    "(Site(model, optimizer, topology=..., node_id=...)), not both")
            topology, node_id, model, optimizer = model, optimizer, parameters, None
        elif parameters is not None:
            raise ConfigError(
                "fedwan.Site(model, optimizer, ...): the third positional argument is only "
                "for Site(topology, node_id, parameters); pass topology= and node_id=")
        if topology is None or node_id is None:
            raise ConfigError("fedwan.Site needs topology= (a Topology or a path) and node_id=")
        if not isinstance(node_id, str):
            raise ConfigError(f"node_id must be a str, got {type(node_id).__name__}")

        tensors = _as_tensors(torch, model)
        if optimizer is not None:
            _check_optimizer(torch, optimizer, tensors)
        if isinstance(topology, (str, os.PathLike)):
            topology = Topology.load(topology)

        self._torch = torch
        self._tensors = tensors
        self._optimizer = optimizer
        self._node_id = node_id
        self._steps_in_round = 0
        self._pending = False  # an overlapped sync is in flight (every rank knows)
        self._joined = False
        self._closed = False
        self._status = {"round": 0, "finished": False, "resynced": False,
                        "bytes_sent": 0, "bytes_received": 0, "bytes_resent": 0,
                        "paused_seconds": 0.0}

        self._dist = None
        self._group = None
        self._leader = True
        if process_group is not None:
            import torch.distributed as dist
            if not dist.is_available() or not dist.is_initialized():
                raise ConfigError(
                    "fedwan.Site(process_group=...): torch.distributed is not initialized; "
                    "call torch.distributed.init_process_group first")
            self._dist = dist
            self._group = process_group
            self._src = _global_rank(dist, process_group, 0)
            self._leader = dist.get_rank(process_group) == 0
            backend = str(dist.get_backend(process_group)).lower()
            self._comm_device = (torch.device("cuda", torch.cuda.current_device())
                                 if backend == "nccl" else torch.device("cpu"))

        # CPU parameters share one buffer with the runtime; others (GPU) are
        # mirrored into a CPU buffer around each call.
        self._shared = _can_share(tensors)
        if self._shared:
            self._flat = _flatten_into_one_buffer(torch, tensors)
        else:
            self._flat = torch.empty(sum(t.numel() for t in tensors), dtype=torch.float32)
            self._copy_to_flat()
        self._array = self._flat.numpy()  # zero-copy view the runtime writes through

        self._core = None
        self._inner_steps = 0
        self._overlap_steps = topology.federation.overlap_steps
        self._rounds = topology.rounds_to_run
        if self._leader:
            self._core = SiteCore(topology, node_id, self._array,
                                  join_timeout_s=join_timeout_s,
                                  round_timeout_s=round_timeout_s, window=window,
                                  credentials=credentials,
                                  insecure_plaintext=insecure_plaintext, cipher=cipher,
                                  audit_log=audit_log, checkpoint_dir=checkpoint_dir,
                                  costs_path=costs_path, metrics=metrics,
                                  metrics_token_file=metrics_token_file,
                                  devices=(self._dist.get_world_size(self._group)
                                           if self._dist is not None else 1),
                                  device_kind="gpu" if self._flat.is_cuda else "cpu")
            self._inner_steps = self._core.inner_steps
        else:
            # Checked here too, so a bad topology fails on every rank.
            node = topology.node(node_id)
            if node.role != "site":
                raise ConfigError(f"node '{node_id}' is not a site of the topology")
            self._inner_steps = topology.federation.inner_steps

    # -- the federation -----------------------------------------------------

    def join(self) -> Dict[str, Any]:
        """Connects and joins the federation; afterwards the parameters hold
        the federation's model for the current round (on every rank of a
        multi-rank site). Returns ``{round, finished, bytes_sent,
        bytes_received, bytes_resent, resynced}``."""
        result = self._leader_call("join", lambda core: core.join(), load_model=True)
        self._joined = True
        self._steps_in_round = 0
        return result

    def step(self) -> Optional[Dict[str, Any]]:
        """Counts one inner step. Every ``inner_steps``-th call ends the round
        with :meth:`sync` (blocking) and returns its result dict; otherwise
        returns None. Between syncs it services the link (heartbeats,
        reconnects); if the parent resynced this site, the parameters now
        hold its model, the round's count restarts and the result dict (with
        ``resynced=True``) is returned.

        With ``overlap_steps`` = tau > 0 the ``inner_steps``-th call sends
        the update and returns None at once; the tau-th call after it merges
        the next model into the parameters (waiting for it if it is not in
        yet) and returns the result dict, as :meth:`sync` would have. In the
        last round the merge follows the update in the same call."""
        serviced = self._leader_call("service", lambda core: core.service(),
                                     load_model="if_resynced")
        if serviced["resynced"]:
            self._steps_in_round = 0
            return serviced
        self._steps_in_round += 1
        if self._pending:
            # Overlapped: the model is merged tau steps after the update went.
            if self._steps_in_round < self._overlap_steps:
                return None
            return self._finish_pending()
        if self._steps_in_round < self._inner_steps:
            return None
        if self._overlap_steps == 0:
            return self.sync()
        self._steps_in_round = 0
        self._leader_call("begin_sync", self._begin_sync, load_model=False)
        self._pending = True
        # After the last round's update, the final model replaces any steps.
        if self.round + 1 >= self._rounds:
            return self._finish_pending()
        return None

    def sync(self) -> Dict[str, Any]:
        """Ends the round now, whatever the step count: sends this site's
        pseudo-gradient, waits for the next global model and loads it into
        the parameters. Returns ``{round, finished, bytes_sent,
        bytes_received, bytes_resent, resynced}``. An overlapped sync in
        flight is merged first (and its result returned when it finished
        the federation); then this one blocks."""
        if self._pending:
            merged = self._finish_pending()
            if merged["finished"]:
                return merged
        self._steps_in_round = 0
        return self._leader_call("sync", lambda core: core.sync(), load_model=True)

    def checkpoint(self) -> None:
        """Writes a checkpoint of the current state to ``checkpoint_dir`` now
        (for a SIGTERM handler); a no-op without one, on ranks other than
        the leader, and while an overlapped sync is in flight (its merge
        checkpoints; until then the last merge's checkpoint stands)."""
        if self._core is not None and not self._core.sync_pending:
            if not self._shared:
                self._copy_to_flat()
            self._core.checkpoint()

    def leave(self, timeout_s: float = 5.0) -> bool:
        """Leaves the federation gracefully between steps (the parent stops
        waiting for this site at once and counts it out of the quorum);
        whether the parent was told within ``timeout_s``. Other ranks of a
        multi-rank site have nothing to tell (True); every rank should stop
        training after it."""
        if self._core is None:
            return True
        return self._core.leave(timeout_s)

    def stop(self) -> None:
        """Makes a ``join()``, ``step()`` or ``sync()`` blocked in another
        thread (or a signal handler's caller) raise :class:`StoppedError`
        within about 100 ms; every later one raises it too. On the leader of
        a multi-rank site the other ranks then raise :class:`Error`."""
        if self._core is not None:
            self._core.stop()

    def close(self) -> None:
        """Releases the link to the federation (sockets, TLS state, audit
        log) now. Idempotent; the parameters keep their values and stay the
        model's. Later join/step/sync raise :class:`Error`."""
        self._closed = True
        if self._core is not None:
            self._core.close()

    def __enter__(self) -> "Site":
        if not self._joined:
            self.join()
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        try:
            if exc_type is not None and self._core is not None and not self._core.closed:
                # Cut short (Ctrl-C, an error in the training loop): keep what
                # the site has. After a sync that raised, the checkpoint of the
                # round's start is kept.
                try:
                    self.checkpoint()
                except Error:
                    pass
        finally:
            self.close()
        return False

    # -- state --------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """True once the federation is done; the parameters hold its final model."""
        return bool(self._status["finished"])

    @property
    def round(self) -> int:
        """The round this site trains in."""
        return int(self._status["round"])

    @property
    def inner_steps(self) -> int:
        """H: the inner steps per round, from the topology."""
        return self._inner_steps

    @property
    def overlap_steps(self) -> int:
        """tau: the inner steps between sending an update and merging the
        next model, from the topology; 0: blocking rounds."""
        return self._overlap_steps

    @property
    def sync_pending(self) -> bool:
        """True while an overlapped sync is in flight (between the step that
        sent the update and the one that merges the next model)."""
        return self._pending

    @property
    def alarms(self) -> List[str]:
        """What the site rode out that an operator must act on ('kind: message');
        empty on ranks other than the leader."""
        return list(self._core.alarms) if self._core is not None else []

    @property
    def flat(self):
        """The contiguous fp32 CPU buffer the runtime reads and writes; every
        CPU parameter is a view of it (GPU parameters are mirrored)."""
        return self._flat

    @property
    def numel(self) -> int:
        """Number of parameters (elements) the site federates."""
        return int(self._flat.numel())

    @property
    def parameters(self) -> List[Any]:
        """The federated tensors, in buffer order."""
        return list(self._tensors)

    @property
    def node_id(self) -> str:
        """This site's id in the topology."""
        return self._node_id

    @property
    def is_leader(self) -> bool:
        """True on the rank that talks to the federation (always, without a
        process group)."""
        return self._leader

    @property
    def closed(self) -> bool:
        """True after :meth:`close` (or leaving the ``with`` block)."""
        return self._closed

    def __repr__(self) -> str:
        return (f"Site(node_id={self._node_id!r}, numel={self.numel}, "
                f"round={self.round}, finished={self.finished})")

    # -- internals ----------------------------------------------------------

    def _begin_sync(self, core) -> Dict[str, Any]:
        """Starts the overlapped sync; the status is the round that ended."""
        core.begin_sync()
        return {"round": core.round, "finished": core.finished, "resynced": False,
                "bytes_sent": 0, "bytes_received": 0, "bytes_resent": 0}

    def _finish_pending(self) -> Dict[str, Any]:
        """Merges the overlapped sync's model (every rank: the leader's
        merged model is broadcast as after a blocking sync)."""
        self._pending = False
        result = self._leader_call("finish_sync", lambda core: core.finish_sync(),
                                   load_model=True)
        if result["resynced"] or result["finished"]:
            self._steps_in_round = 0
        return result

    def _copy_to_flat(self) -> None:
        """Mirrored (GPU) parameters -> the CPU buffer."""
        torch = self._torch
        with torch.no_grad():
            offset = 0
            for t in self._tensors:
                n = t.numel()
                self._flat[offset:offset + n].copy_(t.detach().reshape(-1))
                offset += n

    def _copy_from(self, source) -> None:
        """A flat fp32 tensor (any device) -> the parameters."""
        torch = self._torch
        with torch.no_grad():
            offset = 0
            for t in self._tensors:
                n = t.numel()
                t.copy_(source[offset:offset + n].view_as(t))
                offset += n

    def _leader_call(self, what: str, call, load_model) -> Dict[str, Any]:
        """Runs `call(core)` on the leader and shares its outcome (and, when
        `load_model` says so, the model) with the other ranks."""
        if self._closed:
            raise Error(f"Site.{what}(): the site is closed; build a new Site (it resumes "
                        "from checkpoint_dir if it had one)")
        result: Optional[Dict[str, Any]] = None
        failure: Optional[BaseException] = None
        if self._core is not None:
            if not self._shared and what in ("sync", "begin_sync", "finish_sync"):
                # Mirrored: the update, or the steps since it, to merge into.
                self._copy_to_flat()
            try:
                result = call(self._core)
            except BaseException as e:  # noqa: B036 - re-raised below, after the ranks know
                if self._dist is None:
                    raise
                failure = e
        if self._dist is not None:
            result = self._share_status(what, result, failure)
        assert result is not None
        reload = load_model is True or (load_model == "if_resynced" and result["resynced"])
        if reload:
            if self._dist is not None:
                self._broadcast_model()
            elif not self._shared:
                self._copy_from(self._flat)
        self._status = dict(result)
        return result

    def _share_status(self, what, result, failure) -> Dict[str, Any]:
        """Broadcasts the leader's outcome; raises on every rank when it failed."""
        torch, dist = self._torch, self._dist
        assert dist is not None
        status = torch.zeros(_STATUS_FIELDS, dtype=torch.int64, device=self._comm_device)
        if self._leader:
            if failure is None:
                status.copy_(torch.tensor([
                    1, result["round"], int(result["finished"]), int(result["resynced"]),
                    self._inner_steps, result["bytes_sent"], result["bytes_received"],
                    result["bytes_resent"]],
                    dtype=torch.int64))
        dist.broadcast(status, src=self._src, group=self._group)
        message = torch.zeros(_MESSAGE_BYTES, dtype=torch.uint8, device=self._comm_device)
        values = status.cpu().tolist()
        if values[0] != 1:
            if self._leader:
                text = f"{type(failure).__name__}: {failure}".encode("utf-8", "replace")
                text = text[:_MESSAGE_BYTES]
                message[:len(text)].copy_(torch.tensor(list(text), dtype=torch.uint8))
            dist.broadcast(message, src=self._src, group=self._group)
            if self._leader:
                raise failure
            reason = bytes(message.cpu().tolist()).rstrip(b"\0").decode("utf-8", "replace")
            raise Error(f"Site.{what}(): the site's leader (rank 0 of its process group) "
                        f"failed: {reason}")
        if not self._leader:
            self._inner_steps = int(values[4])
            result = {"round": int(values[1]), "finished": bool(values[2]),
                      "resynced": bool(values[3]), "bytes_sent": int(values[5]),
                      "bytes_received": int(values[6]), "bytes_resent": int(values[7])}
        return result

    def _broadcast_model(self) -> None:
        """The leader's model -> every rank's parameters, in one broadcast."""
        dist = self._dist
        assert dist is not None
        if self._shared and self._comm_device.type == "cpu":
            dist.broadcast(self._flat, src=self._src, group=self._group)
            return
        buffer = self._flat.to(self._comm_device)
        dist.broadcast(buffer, src=self._src, group=self._group)
        if self._shared:
            self._flat.copy_(buffer)
        else:
            self._copy_from(buffer)
            self._flat.copy_(buffer)
