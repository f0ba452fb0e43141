"""A local fake of the Hugging Face Hub: an HTTP server on 127.0.0.1 that answers the requests huggingface_hub
makes to create a repository and a branch, list a repository's files, upload a commit, and download files (what
`HfApi.create_repo` / `create_branch` / `list_repo_files` / `create_commit` and `hf_hub_download`, hence
transformers' `from_pretrained`, send), with the headers and error codes the client reads.

What differs from the Hub, on purpose: the preupload answer sends every file "regular" (inline, base64, in the
commit), so no LFS or Xet transfer is made (the client supports that mode for any file; the real Hub would ask for
LFS for the safetensors); a token is required (any non-empty one) for writes only; a commit is its files, no git.
Requests the fake does not know are answered 404 and recorded in `unknown`, so a test can assert there were none.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"


@dataclass
class Repository:
    branches: dict[str, str]  # branch -> commit id
    commits: dict[str, dict[str, bytes]]  # commit id -> files


@dataclass
class FakeHubState:
    """Repositories by id; each commit as (repo id, branch, added paths, deleted paths); unknown requests."""

    repos: dict[str, Repository] = field(default_factory=dict)
    commits: list[tuple[str, str, list[str], list[str]]] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        repo = self.repos[repo_id]
        return repo.commits[repo.branches.get(revision, revision)]

    def new_commit(self, repo: Repository, files: dict[str, bytes]) -> str:
        commit = hashlib.sha1(f"{len(self.commits)}-{sorted(files)}".encode()).hexdigest()
        repo.commits[commit] = files
        return commit


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # quiet: pytest shows failures, not every request
        pass

    # ------------------------------------------------------------------ answers

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, value: object, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(value).encode(), {"Content-Type": "application/json", **(headers or {})})

    def _error(self, status: int, code: str, message: str) -> None:
        self._json(status, {"error": message}, {"X-Error-Code": code, "X-Error-Message": message})

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def _authorized(self) -> bool:
        if self.headers.get("Authorization", "").removeprefix("Bearer ").strip():
            return True
        self._json(401, {"error": "Invalid credentials in Authorization header"})
        return False

    # ------------------------------------------------------------------ routing

    def do_HEAD(self) -> None:
        self._route()

    def do_GET(self) -> None:
        self._route()

    def do_POST(self) -> None:
        self._route()

    def _route(self) -> None:
        url = urlsplit(self.path)
        parts = [unquote(part) for part in url.path.strip("/").split("/")]
        query = parse_qs(url.query)
        state = self.server.state
        with state.lock:
            if self.command == "POST" and parts == ["api", "repos", "create"]:
                return self._create_repo(json.loads(self._body()))
            if self.command == "GET" and parts == ["api", "agent-harnesses"]:
                # huggingface_hub fetches this registry (for its user-agent string) once a day: an empty one.
                return self._json(200, {"standardEnvVars": [], "harnesses": {}})
            if self.command == "POST" and parts == ["api", "validate-yaml"]:
                return self._validate_yaml(json.loads(self._body()))
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                repo_id, action, rest = "/".join(parts[2:4]), parts[4] if len(parts) > 4 else "", parts[5:]
                if repo_id not in state.repos:
                    return self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
                if self.command == "POST" and action == "branch" and rest:
                    return self._create_branch(repo_id, "/".join(rest))
                if self.command == "GET" and action == "tree" and rest:
                    return self._tree(repo_id, rest[0], "/".join(rest[1:]), query)
                if self.command == "GET" and action in ("", "revision"):
                    return self._info(repo_id, rest[0] if rest else "main")
                if self.command == "POST" and action == "preupload" and rest:
                    return self._preupload(json.loads(self._body()))
                if self.command == "POST" and action == "commit" and rest:
                    return self._commit(repo_id, "/".join(rest))
            if len(parts) >= 5 and parts[2] == "resolve" and self.command in ("HEAD", "GET"):
                return self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
            state.unknown.append(f"{self.command} {self.path}")
            self._error(404, "NotFound", f"the fake Hub does not know {self.command} {url.path}")

    # ------------------------------------------------------------------ endpoints

    def _create_repo(self, payload: dict) -> None:
        if not self._authorized():
            return
        state = self.server.state
        repo_id = f"{payload.get('organization') or 'user'}/{payload['name']}"
        url = f"{self.server.url}/{repo_id}"
        if repo_id in state.repos:
            return self._json(409, {"error": "You already created this model repo", "url": url})
        repo = Repository(branches={}, commits={})
        repo.branches["main"] = state.new_commit(repo, {".gitattributes": GITATTRIBUTES})
        state.repos[repo_id] = repo
        self._json(200, {"url": url, "name": repo_id})

    def _validate_yaml(self, payload: dict) -> None:
        """The card's metadata (the README.md's YAML header, which huggingface_hub sends before a commit that
        holds a README.md) must parse as a mapping; the Hub also checks fields, which this fake does not."""
        content = payload["content"]
        header = content.split("---", 2)[1] if content.startswith("---") else ""
        try:
            metadata = yaml.safe_load(header) if header else {}
        except yaml.YAMLError as error:
            return self._json(400, {"error": f"Invalid YAML: {error}"})
        if not isinstance(metadata, dict):
            return self._json(400, {"error": "the YAML metadata is not a mapping"})
        self._json(200, {"errors": [], "warnings": []})

    def _create_branch(self, repo_id: str, branch: str) -> None:
        if not self._authorized():
            return
        repo = self.server.state.repos[repo_id]
        if branch in repo.branches:
            return self._error(409, "BranchExists", f"Branch {branch} already exists")
        repo.branches[branch] = repo.branches["main"]
        self._json(200, {})

    def _commit_of(self, repo_id: str, revision: str) -> str | None:
        repo = self.server.state.repos[repo_id]
        commit = repo.branches.get(revision, revision)
        if commit not in repo.commits:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return commit

    def _tree(self, repo_id: str, revision: str, folder: str, query: dict) -> None:
        commit = self._commit_of(repo_id, revision)
        if commit is None:
            return
        files = self.server.state.repos[repo_id].commits[commit]
        prefix = f"{folder}/" if folder else ""
        recursive = query.get("recursive", ["False"])[0].lower() == "true"
        entries = [
            {"type": "file", "path": path, "size": len(content), "oid": hashlib.sha1(content).hexdigest()}
            for path, content in sorted(files.items())
            if path.startswith(prefix) and (recursive or "/" not in path[len(prefix) :])
        ]
        if folder and not entries:
            return self._error(404, "EntryNotFound", f"{folder} does not exist on {revision}")
        self._json(200, entries)

    def _info(self, repo_id: str, revision: str) -> None:
        commit = self._commit_of(repo_id, revision)
        if commit is not None:
            files = self.server.state.repos[repo_id].commits[commit]
            siblings = [{"rfilename": path} for path in sorted(files)]
            self._json(200, {"id": repo_id, "modelId": repo_id, "sha": commit, "private": False, "siblings": siblings})

    def _preupload(self, payload: dict) -> None:
        if not self._authorized():
            return
        files = [{"path": entry["path"], "uploadMode": "regular", "shouldIgnore": False} for entry in payload["files"]]
        self._json(200, {"files": files})

    def _commit(self, repo_id: str, revision: str) -> None:
        if not self._authorized():
            return
        state = self.server.state
        repo = state.repos[repo_id]
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        if revision not in repo.branches:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        files = dict(repo.commits[repo.branches[revision]])
        added, deleted = [], []
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "file":
                files[value["path"]] = base64.b64decode(value["content"])
                added.append(value["path"])
            elif key == "deletedFile":
                files.pop(value["path"], None)
                deleted.append(value["path"])
            elif key != "header":  # lfsFile: never asked for by this fake's preupload answer
                return self._json(400, {"error": f"the fake Hub takes no {key!r} operations"})
        repo.branches[revision] = commit = state.new_commit(repo, files)
        state.commits.append((repo_id, revision, added, deleted))
        self._json(200, {"commitUrl": f"{self.server.url}/{repo_id}/commit/{commit}", "commitOid": commit})

    def _resolve(self, repo_id: str, revision: str, path: str) -> None:
        state = self.server.state
        if repo_id not in state.repos:
            return self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
        commit = self._commit_of(repo_id, revision)
        if commit is None:
            return
        files = state.repos[repo_id].commits[commit]
        if path not in files:
            return self._error(404, "EntryNotFound", f"{path} does not exist on {revision}")
        content = files[path]
        etag = f'"{hashlib.sha1(content).hexdigest()}"'
        self._send(200, content, {"X-Repo-Commit": commit, "ETag": etag, "Content-Type": "application/octet-stream"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: FakeHubState
    url: str


@contextmanager
def fake_hub() -> Iterator[tuple[str, FakeHubState]]:
    """(endpoint URL, state) of a fake Hub serving on 127.0.0.1 for the body; stopped (and its thread joined)
    after it."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.state = FakeHubState()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.url, server.state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
