"""push_hybrid / load_hybrid("hf://...") against a tiny fake Hugging Face Hub on 127.0.0.1.

The fake implements only what huggingface_hub uses here: create_repo, preupload (every file "regular",
so no LFS/xet traffic), commit (NDJSON), repo info, tree listing and file resolve (HEAD + GET). The real
client library talks to it over HTTP, so the layout on the "Hub" and the round trip are both real.
"""
from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import torch

from headsurgeon.hub.checkpoint import (BaseModelError, CheckpointError, UntrustedProgramError, hf_state_dict, load_hybrid,
                                        read_manifest, save_hybrid)
from headsurgeon.hub.remote import parse_hf_url, push_hybrid
from headsurgeon.surgery.swap.replace import replace_heads
from headsurgeon.synth.program import Program


class FakeHub:
    """In-memory git-less Hub: repo -> list of commits, each a full {path: bytes} snapshot."""

    def __init__(self) -> None:
        self.repos: dict[str, list[tuple[str, dict[str, bytes]]]] = {}
        self.calls: list[tuple[str, str]] = []
        self.validated: list[str] = []
        self.lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body: bytes = b"", headers: dict | None = None, ctype="application/json"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _json(self, obj, code=200):
                self._send(code, json.dumps(obj).encode())

            def _body(self) -> bytes:
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def do_POST(self):
                hub.route(self, "POST")

            def do_GET(self):
                hub.route(self, "GET")

            def do_HEAD(self):
                hub.route(self, "HEAD")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # ------------------------------------------------------------------ helpers
    def head_of(self, repo: str, rev: str | None) -> tuple[str, dict[str, bytes]] | None:
        commits = self.repos.get(repo)
        if not commits:
            return None
        if rev in (None, "main"):
            return commits[-1]
        for sha, files in commits:
            if sha == rev:
                return sha, files
        return None

    def files(self, repo: str) -> dict[str, bytes]:
        return dict(self.repos[repo][-1][1])

    def _commit(self, repo: str, files: dict[str, bytes]) -> str:
        sha = hashlib.sha1(repr((repo, len(self.repos[repo]), sorted(files))).encode()).hexdigest()
        self.repos[repo].append((sha, files))
        return sha

    # ------------------------------------------------------------------ routing
    def route(self, h, method: str) -> None:
        parsed = urlparse(h.path)
        path = unquote(parsed.path)
        self.calls.append((method, path))
        with self.lock:
            if method == "POST" and path == "/api/repos/create":
                body = json.loads(h._body() or b"{}")
                repo = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
                if repo not in self.repos:
                    self.repos[repo] = []
                    self._commit(repo, {".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"})
                return h._json({"url": f"{self.url}/{repo}", "name": repo})
            if method == "POST" and path == "/api/validate-yaml":  # the model card's front matter
                content = json.loads(h._body())["content"]
                self.validated.append(content)
                ok = content.startswith("---\n") and "\n---\n" in content[4:]
                return h._json({"errors": [] if ok else [{"message": "no front matter"}], "warnings": []},
                               200 if ok else 400)
            if path.startswith("/api/models/"):
                rest = path[len("/api/models/"):]
                parts = rest.split("/")
                repo = "/".join(parts[:2])
                action = parts[2] if len(parts) > 2 else None
                if repo not in self.repos:
                    h._body()
                    return h._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
                if method == "POST" and action == "preupload":
                    body = json.loads(h._body())
                    return h._json({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False,
                                               "oid": None} for f in body["files"]]})
                if method == "POST" and action == "commit":
                    files = self.files(repo)
                    for line in h._body().splitlines():
                        item = json.loads(line)
                        if item["key"] == "file":
                            files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                        elif item["key"] == "deletedFile":
                            files.pop(item["value"]["path"], None)
                        elif item["key"] == "deletedFolder":
                            prefix = item["value"]["path"].rstrip("/") + "/"
                            for p in [p for p in files if p.startswith(prefix)]:
                                files.pop(p)
                        elif item["key"] != "header":
                            return h._send(400, json.dumps({"error": f"unsupported {item['key']}"}).encode())
                    sha = self._commit(repo, files)
                    return h._json({"commitUrl": f"{self.url}/{repo}/commit/{sha}", "commitOid": sha})
                if method == "GET" and action == "revision":
                    found = self.head_of(repo, parts[3] if len(parts) > 3 else None)
                    if found is None:
                        return h._send(404, b'{"error": "Revision not found"}', {"X-Error-Code": "RevisionNotFound"})
                    sha, files = found
                    return h._json({"id": repo, "modelId": repo, "sha": sha, "private": False,
                                    "siblings": [{"rfilename": p} for p in sorted(files)]})
                if method == "GET" and action == "tree":
                    found = self.head_of(repo, parts[3] if len(parts) > 3 else None)
                    if found is None:
                        return h._send(404, b'{"error": "Revision not found"}', {"X-Error-Code": "RevisionNotFound"})
                    _, files = found
                    return h._json([{"type": "file", "path": p, "size": len(b),
                                     "oid": hashlib.sha1(b"blob %d\0" % len(b) + b).hexdigest()}
                                    for p, b in sorted(files.items())])
            # file resolve: /{org}/{name}/resolve/{rev}/{path}
            parts = path.strip("/").split("/")
            if len(parts) >= 5 and parts[2] == "resolve" and method in ("GET", "HEAD"):
                repo, rev, rel = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                found = self.head_of(repo, rev)
                if found is None or rel not in found[1]:
                    return h._send(404, b'{"error": "Entry not found"}', {"X-Error-Code": "EntryNotFound"})
                sha, files = found
                data = files[rel]
                etag = '"' + hashlib.sha256(data).hexdigest() + '"'
                return h._send(200, data, {"X-Repo-Commit": sha, "ETag": etag},
                               ctype="application/octet-stream")
            h._body()
            return h._send(404, json.dumps({"error": f"fake hub: no route {method} {path}"}).encode())

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def hub():
    with FakeHub() as fake:
        yield fake


@pytest.fixture(scope="module")
def tiny_gpt2_dir(tmp_path_factory) -> Path:
    from support.tiny_gpt2 import make_tiny_gpt2

    return make_tiny_gpt2(tmp_path_factory.mktemp("tiny") / "gpt2")


@pytest.fixture(scope="module")
def gpt2(tiny_gpt2_dir):
    from headsurgeon.surgery.models.loading import load_model

    return load_model(tiny_gpt2_dir)


def _ids(handle, text="Once upon a time there was a little dog who liked to run."):
    return torch.tensor([handle.tokenizer(text).input_ids])


PROGRAMS = {(0, 1): Program.parse("prev(1)"), (1, 2): Program.parse("0.5*prev(1) + 0.5*first()")}


def test_parse_hf_url():
    assert parse_hf_url("hf://org/name") == ("org/name", None)
    assert parse_hf_url("hf://org/name@abc123") == ("org/name", "abc123")
    assert parse_hf_url("org/name@v1") == ("org/name", "v1")
    for bad in ("hf://", "hf://org/name@", "hf://a/b/c", "hf://../x"):
        with pytest.raises(CheckpointError, match="hf://org/name"):
            parse_hf_url(bad)


def test_push_then_load_from_hub_reproduces_logits(hub, gpt2, tiny_gpt2_dir, tmp_path, monkeypatch):
    hybrid = replace_heads(gpt2, PROGRAMS, alpha={(1, 2): 0.25})
    try:
        ids = _ids(gpt2)
        with torch.no_grad():
            want = hybrid(ids)
        info = push_hybrid(hybrid, "acme/gpt2-hybrid", token="hf_fake", endpoint=hub.url,
                           metrics={"delta_ppl": 0.125, "ppl": {"base": 40.0, "hybrid": 45.0}})
        local = save_hybrid(hybrid, tmp_path / "local")
    finally:
        hybrid.restore()
    assert info.oid == hub.repos["acme/gpt2-hybrid"][-1][0]
    methods = {(m, p.split("/")[-2] if p.startswith("/api/models/") else p) for m, p in hub.calls}
    assert ("POST", "/api/repos/create") in methods and ("POST", "preupload") in methods
    assert ("POST", "commit") in methods

    # the repo holds exactly the checkpoint layout (+ the Hub's own .gitattributes)
    remote = hub.files("acme/gpt2-hybrid")
    assert set(remote) - {".gitattributes"} == {p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()}
    manifest = json.loads(remote["manifest.json"])
    for rel, meta in manifest["files"].items():
        assert hashlib.sha256(remote[rel]).hexdigest() == meta["sha256"], rel
    card = remote["README.md"].decode()
    assert 'hs.load_hybrid("hf://acme/gpt2-hybrid")' in card
    assert "| delta_ppl | 0.125 |" in card and "| ppl.hybrid | 45 |" in card
    assert "model.safetensors" not in remote  # untouched weights are referenced, not uploaded

    # the manifest names the local base portably (no path of the pushing machine): a Hub user says where it is
    with monkeypatch.context() as elsewhere:  # a user on another machine: no index of the pusher's bases
        elsewhere.setenv("HEADSURGEON_CACHE", str(tmp_path / "another-machine"))
        with pytest.raises(BaseModelError, match="base_model="):
            load_hybrid("hf://acme/gpt2-hybrid", endpoint=hub.url, cache_dir=tmp_path / "cache")
    assert str(tiny_gpt2_dir.parent) not in remote["manifest.json"].decode()
    loaded = load_hybrid("hf://acme/gpt2-hybrid", endpoint=hub.url, cache_dir=tmp_path / "cache",
                         base_model=tiny_gpt2_dir)
    try:
        with torch.no_grad():
            got = loaded(ids)
        assert torch.equal(got, want)
        assert loaded.replaced == PROGRAMS
        assert {k: ph.alpha for k, ph in loaded.program_heads.items()} == {"L0H1": 1.0, "L1H2": 0.25}
    finally:
        loaded.restore()
    # a pinned revision resolves the same commit
    pinned = load_hybrid(f"hf://acme/gpt2-hybrid@{info.oid}", endpoint=hub.url, cache_dir=tmp_path / "cache2",
                         base_model=tiny_gpt2_dir)
    pinned.restore()
    assert pinned.replaced == PROGRAMS


def test_push_again_replaces_stale_files_and_embeds_changed_weights(hub, tiny_gpt2_dir, tmp_path):
    from headsurgeon.surgery.models.loading import load_model

    handle = load_model(tiny_gpt2_dir)  # private copy: its weights change below
    weight = hf_state_dict(handle.hf_model)["transformer.h.1.mlp.c_fc.weight"]  # shares the live storage
    saved = weight.detach().clone()
    hybrid = replace_heads(handle, {(0, 0): Program.parse("first()")})
    try:
        with torch.no_grad():
            weight.mul_(1.5)  # stand-in for fine-tuning
            want = hybrid(_ids(handle))
        push_hybrid(hybrid, "acme/tuned", token="hf_fake", endpoint=hub.url)
        assert "model.safetensors" in hub.files("acme/tuned")
        hybrid.restore()
        # pushing an unmodified hybrid to the same repo removes the now-stale weights
        with torch.no_grad():
            weight.copy_(saved)
        second = replace_heads(handle, {(1, 3): Program.parse("prev(2)")})
        push_hybrid(second, "acme/tuned", token="hf_fake", endpoint=hub.url)
        second.restore()
    finally:
        hybrid.restore()
    files = hub.files("acme/tuned")
    assert "model.safetensors" not in files and "config.json" not in files
    loaded = load_hybrid("hf://acme/tuned", endpoint=hub.url, cache_dir=tmp_path / "c", base_model=tiny_gpt2_dir)
    loaded.restore()
    assert loaded.replaced == {(1, 3): Program.parse("prev(2)")}
    # the first commit (embedded weights) is still loadable by its revision, bit for bit
    first_sha = hub.repos["acme/tuned"][1][0]
    old = load_hybrid(f"hf://acme/tuned@{first_sha}", endpoint=hub.url, cache_dir=tmp_path / "c2")
    try:
        assert read_manifest(old.handle.source.path)["weights"]["stored"] == "embedded"
        with torch.no_grad():
            assert torch.equal(old(_ids(handle)), want)
    finally:
        old.restore()


def test_python_program_from_hub_needs_trust(hub, gpt2, tmp_path):
    src = "def f(seq):\n    return np.ones((seq.n, seq.n))\n"
    program = Program.python(src)
    hybrid = replace_heads(gpt2, {(0, 2): program})
    hybrid.restore()
    push_hybrid(hybrid, "acme/py", token="hf_fake", endpoint=hub.url)
    card = hub.files("acme/py")["README.md"].decode()
    assert f'trust_programs={{"{program.hash}"}}' in card
    with pytest.raises(UntrustedProgramError, match=r"programs/.*\.py.*trust_programs=True"):
        load_hybrid("hf://acme/py", endpoint=hub.url, cache_dir=tmp_path / "c")
    loaded = load_hybrid("hf://acme/py", trust_programs={program.hash}, endpoint=hub.url, cache_dir=tmp_path / "c",
                         base_model=gpt2)
    loaded.restore()
    assert loaded.replaced == {(0, 2): program}


def test_missing_repo_is_a_clear_error(hub, tmp_path):
    from huggingface_hub.errors import RepositoryNotFoundError

    with pytest.raises(RepositoryNotFoundError):
        load_hybrid("hf://acme/nothing-here", endpoint=hub.url, cache_dir=tmp_path / "c")


def test_local_checkpoint_layout_matches_hub_layout_without_network(gpt2, tmp_path, monkeypatch):
    """push_hybrid's calls, recorded with a stand-in HfApi: create_repo, then upload_folder of a checkpoint."""
    import huggingface_hub

    calls = []

    class RecordingApi:
        def __init__(self, endpoint=None, token=None):
            calls.append(("init", endpoint, token))

        def create_repo(self, repo_id, private=False, exist_ok=False):
            calls.append(("create_repo", repo_id, private, exist_ok))

        def create_branch(self, repo_id, branch, exist_ok=False):
            calls.append(("create_branch", repo_id, branch))

        def upload_folder(self, repo_id, folder_path, revision=None, commit_message=None, delete_patterns=None):
            folder = Path(folder_path)
            manifest = read_manifest(folder)
            calls.append(("upload_folder", repo_id, revision, delete_patterns,
                          sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()),
                          manifest["format"]))
            return "ok"

    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingApi)
    hybrid = replace_heads(gpt2, {(0, 1): Program.parse("prev(1)")})
    hybrid.restore()
    assert push_hybrid(hybrid, "hf://me/x@dev", token="t", private=True, endpoint="http://e") == "ok"
    assert calls[0] == ("init", "http://e", "t")
    assert calls[1] == ("create_repo", "me/x", True, True)
    assert calls[2] == ("create_branch", "me/x", "dev")
    kind, repo, rev, delete, files, fmt = calls[3]
    assert (kind, repo, rev, delete, fmt) == ("upload_folder", "me/x", "dev", "*", "headsurgeon.hybrid")
    assert files == ["README.md", "manifest.json", f"programs/{Program.parse('prev(1)').hash[:16]}.json"]
