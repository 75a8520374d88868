"""The ``mirror`` tests: the CLI run as a user runs it, against a local hub on 127.0.0.1.

The hub (tests/fixtures/hub) serves tiny models and datasets under the real ids; every
test starts ``python -m adalora_cli`` in a fresh process with ``HF_ENDPOINT`` pointing at
it and the hub online (``HF_HUB_OFFLINE`` unset), so huggingface_hub, datasets and
transformers take the same code paths as on huggingface.co. The processes of one session
share one ``HF_HOME``, as runs on one machine share the user's cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.hub.build import ACCESS_TOKEN, ensure_built
from tests.fixtures.hub.server import HubServer

ROOT = Path(__file__).resolve().parents[2]
OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")

@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


class LocalHub:
    """The running server plus the environment a user's shell would have."""

    def __init__(self, server: HubServer, home: Path):
        self.server, self.home = server, home
        self.url = server.url

    def env(self, token: str | None = None, home: Path | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in OFFLINE and k != "HF_TOKEN"}
        env.update(HF_ENDPOINT=self.url, HF_HOME=str(home or self.home),
                   HF_HUB_DISABLE_TELEMETRY="1", PYTHONPATH=str(ROOT))
        if token is not None:
            env["HF_TOKEN"] = token
        return env

    def run(self, *args: str, token: str | None = None, home: Path | None = None,
            timeout: int = 600) -> Done:
        """``python -m adalora_cli ARGS`` from the repository root, as a user runs it."""
        done = subprocess.run([sys.executable, "-m", "adalora_cli", *args], cwd=ROOT,
                              env=self.env(token, home), capture_output=True, text=True,
                              timeout=timeout)
        return Done(done.returncode, done.stdout, done.stderr)

    def python(self, code: str, home: Path | None = None) -> Done:
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=self.env(home=home),
                              capture_output=True, text=True, timeout=600)
        return Done(done.returncode, done.stdout, done.stderr)

    def requested(self, fragment: str) -> list[str]:
        """Paths of the successful requests that contain ``fragment``."""
        return [path for _, path, status in self.server.requests
                if fragment in path and status < 400]

    def commit(self, kind: str, repo_id: str, revision: str) -> str:
        sha = self.server.hub.repos[(kind, repo_id)].reader.resolve(revision)
        assert sha is not None, (repo_id, revision)
        return sha


@pytest.fixture(scope="session")
def local_hub(tmp_path_factory):
    root = ensure_built()
    with HubServer(root) as server:
        yield LocalHub(server, tmp_path_factory.mktemp("hf-home"))


@pytest.fixture(scope="session")
def access_token() -> str:
    return ACCESS_TOKEN


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
