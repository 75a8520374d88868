"""The local hub itself: each repo stored as README.md says the real one is (weight files,
stored dtype, gating, branches), served with the hub's protocol (redirects to another
origin for LFS files, URL-encoded revisions, the X-Error-Code of each failure)."""

from __future__ import annotations

import hashlib
import io
import json
import struct
import urllib.error
import urllib.request
from urllib.parse import quote

import pytest
import torch

pytestmark = pytest.mark.mirror

# repo: (weight files on main, stored dtype); the facts README.md sources
WEIGHTS = {
    "microsoft/deberta-v3-base": ({"pytorch_model.bin"}, "F16"),
    "facebook/bart-large": ({"pytorch_model.bin", "model.safetensors"}, "F16"),
    "google-t5/t5-base": ({"pytorch_model.bin", "model.safetensors"}, "F32"),
    "openai-community/gpt2": ({"pytorch_model.bin", "model.safetensors"}, "F32"),
    "EleutherAI/pythia-410m": ({"pytorch_model.bin", "model.safetensors"}, "F16"),
    "facebook/opt-350m": ({"pytorch_model.bin"}, "F16"),
    "meta-llama/Llama-3.2-1B": ({"model.safetensors"}, "BF16"),
    "Qwen/Qwen2.5-0.5B": ({"model.safetensors"}, "BF16"),
    "Qwen/Qwen3-0.6B": ({"model.safetensors"}, "BF16"),
    "mistralai/Mistral-7B-v0.3": ({f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)},
                                  "BF16"),
    "google/gemma-2-2b": ({f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)}, "F32"),
    "microsoft/Phi-3-mini-4k-instruct": ({"model-00001-of-00002.safetensors",
                                          "model-00002-of-00002.safetensors"}, "BF16"),
}
GATED = {"meta-llama/Llama-3.2-1B", "mistralai/Mistral-7B-v0.3", "google/gemma-2-2b"}
TORCH_NAMES = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32"}


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def request(url: str, token: str | None = None, method: str = "GET", follow: bool = True):
    """(status, headers, body) of one request; HTTP errors are answers, not exceptions."""
    req = urllib.request.Request(url, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(*([] if follow else [NoRedirect()]))
    try:
        with opener.open(req, timeout=30) as answer:
            return answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def dtypes_of(name: str, data: bytes) -> set[str]:
    if name.endswith(".safetensors"):
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + length])
        return {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    state = torch.load(io.BytesIO(data), weights_only=True)
    return {TORCH_NAMES[t.dtype] for t in state.values()}


@pytest.mark.parametrize("repo_id", sorted(WEIGHTS))
def test_weights_are_stored_as_the_real_repo_stores_them(local_hub, access_token, repo_id):
    status, _, body = request(f"{local_hub.url}/api/models/{repo_id}")
    assert status == 200
    files = {s["rfilename"] for s in json.loads(body)["siblings"]}
    expected_files, expected_dtype = WEIGHTS[repo_id]
    assert {f for f in files if f.endswith((".bin", ".safetensors"))} == expected_files
    for name in expected_files:
        status, _, data = request(f"{local_hub.url}/{repo_id}/resolve/main/{name}",
                                  token=access_token)
        assert status == 200, (repo_id, name, status)
        assert dtypes_of(name, data) == {expected_dtype}, (repo_id, name)


@pytest.mark.parametrize("repo_id", sorted(GATED))
def test_gated_repos_list_files_but_serve_them_only_to_a_token_with_access(
        local_hub, access_token, repo_id):
    status, _, body = request(f"{local_hub.url}/api/models/{repo_id}")
    assert status == 200 and json.loads(body)["gated"] in ("auto", "manual")
    url = f"{local_hub.url}/{repo_id}/resolve/main/config.json"
    for token, code in ((None, 401), ("hf_notAllowed", 403)):
        status, headers, _ = request(url, token=token)
        assert (status, headers["X-Error-Code"]) == (code, "GatedRepo")
    assert request(url, token=access_token)[0] == 200


def test_an_lfs_file_redirects_to_another_origin_with_its_sha256(local_hub):
    url = f"{local_hub.url}/openai-community/gpt2/resolve/main/model.safetensors"
    status, headers, _ = request(url, method="HEAD", follow=False)
    assert status == 302
    location = headers["Location"]
    assert location.startswith("http://") and not location.startswith(local_hub.url + "/")
    assert headers["X-Repo-Commit"] == local_hub.commit("model", "openai-community/gpt2",
                                                        "main")
    status, _, data = request(location)
    assert status == 200
    assert headers["X-Linked-Etag"] == f'"{hashlib.sha256(data).hexdigest()}"'
    assert int(headers["X-Linked-Size"]) == len(data)
    # a plain (non-LFS) file is served in place, its ETag the git blob id
    status, headers, data = request(f"{local_hub.url}/openai-community/gpt2/resolve/main/"
                                    "config.json", follow=False)
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    assert status == 200 and headers["ETag"] == f'"{blob}"'


def test_xsum_keeps_its_script_on_main_and_parquet_on_the_conversion_branch(local_hub):
    base = f"{local_hub.url}/api/datasets/EdinburghNLP/xsum"
    refs = json.loads(request(f"{base}/refs")[2])
    assert [r["ref"] for r in refs["branches"]] == ["refs/heads/main"]
    assert [r["ref"] for r in refs["converts"]] == ["refs/convert/parquet"]
    main = [f["path"] for f in json.loads(request(f"{base}/tree/main?recursive=true")[2])]
    assert "xsum.py" in main and not any(p.endswith(".parquet") for p in main)
    conversion = quote("refs/convert/parquet", safe="")
    files = json.loads(request(f"{base}/tree/{conversion}/default?recursive=true")[2])
    assert {f["path"] for f in files if f["type"] == "file"} == {
        f"default/{s}/0000.parquet" for s in ("train", "validation", "test")}
    assert all("lfs" in f for f in files if f["type"] == "file")


def test_errors_carry_the_hub_error_codes(local_hub):
    url = local_hub.url
    cases = [(f"{url}/openai-community/gpt2/resolve/main/nope.json", 404, "EntryNotFound"),
             (f"{url}/openai-community/gpt2/resolve/v9.9/config.json", 404, "RevisionNotFound"),
             (f"{url}/api/models/openai-community/gpt2/revision/v9.9", 404, "RevisionNotFound"),
             (f"{url}/nobody/nothing/resolve/main/config.json", 401, "RepoNotFound")]
    for address, code, error in cases:
        status, headers, _ = request(address)
        assert (status, headers["X-Error-Code"]) == (code, error), address
