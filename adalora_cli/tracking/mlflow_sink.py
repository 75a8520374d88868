"""MLflow: one MLflow run per training run, in the experiment ``log.project``.

The flattened config becomes the run's params, the sweep/task/method/budget/seed its tags,
every curve a metric with its step, the heatmap an image (``log_image`` with a step), and
the summary ``final/...`` metrics plus tags for text facts such as the device. The run id
is saved in trackers.json; a resumed run sets the same run back to RUNNING and goes on
logging into it. The client is used directly (no global active run), so several runs in
one process never cross.

Metrics are buffered and sent every ``FLUSH_S`` seconds (or 1,000 metrics) as one batch
on a sender thread of this sink: on a SQLite store a call costs tens of milliseconds
however small, which every step would pay, and AdaLoRA adds one rank per matrix at every
mask event. Sent batches are waited for as they pile up and all at close, so a failure
still surfaces here and the tracker is dropped. The sender is a daemon thread, not
MLflow's own asynchronous queue: the interpreter waits at exit for that queue's threads,
so a server that stopped answering mid-run held the finished process for as long as
MLflow retried.

An HTTP tracking server is first asked for ``/health`` with the whole exchange (connect,
send, the first byte of an answer) bounded by ``CONNECT_S``: MLflow's own client retries an
unreachable or silent server with a growing backoff for minutes (372 s against one that
accepts the connection and never answers) before it gives up, and the run would stall that
long before its one warning.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import time
from functools import partial
from typing import Any
from urllib.parse import urlparse

from .base import RunInfo, Sink
from .bounded import Worker

PACKAGES = ("mlflow", "sqlalchemy", "alembic")  # mlflow-skinny plus its SQLite store

_BATCH = 100  # MLflow's limit on params per log_batch call
_METRICS = 1000  # MLflow's limit on metrics per log_batch call
FLUSH_S = 2.0  # the longest a metric waits in the buffer: MLflow lags at most this much
_PENDING = 16  # batches in flight before the oldest half is waited for
CONNECT_S = 5.0  # how long an HTTP tracking server may take to answer at all


def check_reachable(uri: str | None, timeout: float | None = None) -> None:
    """Fail within ``timeout`` seconds, all told, if an http(s) tracking URI does not
    answer: no connection, or one that is accepted and never answered (a hung server, a
    proxy holding the line). Any HTTP answer counts; what it says is MLflow's to judge."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    parts = urlparse(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return  # a local store (sqlite:, file:): nothing to wait for
    port = parts.port or (443 if parts.scheme == "https" else 80)
    timeout = CONNECT_S if timeout is None else timeout
    deadline = time.monotonic() + timeout

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no answer within {timeout:g} s")
        return remaining

    try:
        sock = socket.create_connection((parts.hostname, port), timeout=left())
        try:
            if parts.scheme == "https":  # only "does it answer": MLflow verifies the cert
                context = ssl.create_default_context()
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
                sock.settimeout(left())
                sock = context.wrap_socket(sock, server_hostname=parts.hostname)
            path = (parts.path.rstrip("/") or "") + "/health"
            sock.settimeout(left())
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: {parts.hostname}\r\n\r\n".encode())
            sock.settimeout(left())
            if not sock.recv(1):
                raise ConnectionError("the connection was closed without an answer")
        finally:
            sock.close()
    except OSError as err:  # TimeoutError and ConnectionError are OSErrors too
        why = err.strerror or str(err) or "timed out"
        if isinstance(err, socket.timeout) and not err.strerror:
            why = f"no answer within {timeout:g} s"
        raise ConnectionError(f"MLflow server {uri} is unreachable ({why}); check "
                              "log.mlflow_uri and that the server runs") from None


class MlflowSink(Sink):
    name = "mlflow"

    def __init__(self, info: RunInfo):
        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # no schema-migration chatter
        saved = info.state or {}
        uri = saved.get("tracking_uri") if info.resumed else None
        check_reachable(uri or info.log.mlflow_uri)
        self.client = MlflowClient(tracking_uri=uri or info.log.mlflow_uri)
        # Resumed: {metric: last step MLflow holds}, looked up once per metric, so points
        # logged past the checkpoint the run resumes from are kept, not doubled.
        self.last_step: dict[str, int] | None = None
        self.buffer: list = []  # Metric entities not sent yet
        self.sent_at = time.monotonic()
        self.sender = Worker("mlflow-sender")
        self.pending: list = []  # log_batch calls handed to the sender
        if info.resumed and saved.get("run_id"):
            self.run_id = saved["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            self.last_step = {}
        else:
            self.run_id = self._create(info)
        self.state = {"run_id": self.run_id, "tracking_uri": self.client.tracking_uri}

    def _create(self, info: RunInfo) -> str:
        from mlflow.entities import Param

        experiment = self.client.get_experiment_by_name(info.project)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment(info.project))
        run = self.client.create_run(experiment_id, run_name=info.name, tags=info.tags)
        params = [Param(k, str(v)) for k, v in info.hparams.items()]
        for i in range(0, len(params), _BATCH):
            self.client.log_batch(run.info.run_id, params=params[i:i + _BATCH])
        return run.info.run_id

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.buffer += [Metric(k, float(v), now, step) for k, v in metrics.items()
                        if step > self._held(k)]
        if len(self.buffer) >= _METRICS or time.monotonic() - self.sent_at >= FLUSH_S:
            self._send()

    def _send(self) -> None:
        for i in range(0, len(self.buffer), _METRICS):
            self.pending.append(self.sender.submit(partial(
                self.client.log_batch, self.run_id, metrics=self.buffer[i:i + _METRICS],
                synchronous=True)))
        self.buffer, self.sent_at = [], time.monotonic()
        if len(self.pending) > _PENDING:
            self._wait(_PENDING // 2)

    def _wait(self, n: int | None = None) -> None:
        """Wait for the oldest ``n`` (all) sent batches; raises if one failed."""
        count = len(self.pending) if n is None else n
        done, self.pending = self.pending[:count], self.pending[count:]
        for call in done:
            call.result()

    def _held(self, key: str) -> int:
        """The last step of ``key`` an earlier segment of this run logged (-1: none)."""
        if self.last_step is None:
            return -1
        if key not in self.last_step:
            history = self.client.get_metric_history(self.run_id, key)
            self.last_step[key] = max((m.step for m in history), default=-1)
        return self.last_step[key]

    def log_image(self, step: int, key: str, image) -> None:
        self.client.log_image(self.run_id, image, key=key, step=step)

    def log_summary(self, step: int, numbers: dict[str, float], texts: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.log_metrics(step, numbers)
        self._send()
        self.client.log_batch(self.run_id, tags=[RunTag(f"final/{k}", str(v)[:5000])
                                                 for k, v in texts.items()])

    def close(self, finished: bool) -> None:
        self._send()
        self._wait()
        self.sender.stop()
        self.client.set_terminated(self.run_id, status="FINISHED" if finished else "FAILED")


def open_sink(info: RunInfo) -> Sink:
    return MlflowSink(info)
