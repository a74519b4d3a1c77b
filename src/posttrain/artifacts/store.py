"""Content-addressed artifact store with atomic writes, verified reads and a rebuildable lineage index.

An artifact's id (hashing.artifact_id) is a sha256 over its kind, its files' (relative path, sha256) pairs AND
its sorted parent ids - what it is and what it was made from. So a tokenizer trained byte-identically from an
edited dataset is a new artifact whose parent is the edited dataset (were the id the files alone, the put would
find the first tokenizer and `lineage` would show the old data), while storing the same content with the same
parents again returns the existing artifact (the stage caches and every rank of one run rely on that). The
bytes are not stored twice: identical files are hard-linked (below). Artifacts stored before parents counted
keep their content-only ids; nothing re-derives an id from a manifest, so both kinds of id stay valid.

Layout under the root (a local folder or any fsspec URL):

    objects/<id>/files/...        the artifact's files
    objects/<id>/manifest.json    written LAST: an object without a manifest does not exist
    blobs/<sha[:2]>/<sha256>      local roots: one hard link per distinct file content (see below)
    cache/<key>.json              stage cache: input key -> artifact id
    tmp/                          local writes are staged here and renamed into objects/ (atomic)
    index.sqlite                  a cache of the manifests (local roots); deleted or damaged, it is rebuilt

Reads verify every file's sha256 against the manifest. Identical files are stored once (local roots): a
file whose sha256 is already in `blobs/` is hard-linked into the new artifact instead of copied, after the
blob is re-hashed (a blob edited in place is never linked into a new artifact; it is replaced). So a model
whose weights equal an earlier artifact's (a pass-through, an RL checkpoint with an unchanged policy, the
tokenizer files every checkpoint of one base model carries) costs no extra disk. Linked files share one
inode: editing one stored copy in place changes every artifact that holds it, and `verify` reports each.
What this leaves out: garbage collection (an artifact's disk is freed once its objects/ folder AND the
blobs no other artifact links - `st_nlink == 1` - are deleted), de-duplication on fsspec (remote) roots,
and locking between concurrent writers of *different* artifacts (the same artifact is idempotent by design).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import fsspec

from posttrain.artifacts import codeversion
from posttrain.artifacts.errors import ArtifactIntegrityError, ArtifactNotFoundError, StoreConfigError
from posttrain.artifacts.handles import ArtifactRef
from posttrain.artifacts.hashing import artifact_id, sha256_stream
from posttrain.artifacts.hashing import cache_key as _cache_key
from posttrain.artifacts.index import LineageIndex
from posttrain.artifacts.manifest import KINDS, Manifest
from posttrain.artifacts.state import is_local


def default_root() -> str:
    """POSTTRAIN_HOME, or ~/.posttrain - refused inside a remote Flyte execution, where a local folder
    would vanish with the pod and break lineage."""
    home = os.environ.get("POSTTRAIN_HOME")
    if home:
        return home
    execution = os.environ.get("FLYTE_INTERNAL_EXECUTION_ID", "")
    if execution and execution != "local":
        raise StoreConfigError(
            "this is a remote Flyte execution but POSTTRAIN_HOME is not set, so artifacts would be written to "
            "the pod's local disk (~/.posttrain) and lost; set POSTTRAIN_HOME to an object-store URL such as "
            "s3://bucket/posttrain (e.g. `pyflyte run --remote --env POSTTRAIN_HOME=s3://...`)")
    return str(Path.home() / ".posttrain")


@dataclass(frozen=True, kw_only=True)
class LineageNode:
    manifest: Manifest
    parents: list[LineageNode]


class ArtifactStore:
    def __init__(self, root: str | os.PathLike | None = None):
        root = str(root) if root is not None else default_root()
        self.fs, self._path = fsspec.core.url_to_fs(root)
        self.local = is_local(self.fs)
        self.root = str(Path(self._path).resolve()) if self.local else root
        if self.local:
            Path(self.root).mkdir(parents=True, exist_ok=True)
            index_path = Path(self.root) / "index.sqlite"
        else:
            tag = hashlib.sha256(root.encode()).hexdigest()[:16]
            index_path = Path.home() / ".cache" / "posttrain" / f"index-{tag}.sqlite"
        self.index = LineageIndex(index_path, rebuild=self._all_manifests)

    # ------------------------------------------------------------------------------------- paths

    def _p(self, *parts: str) -> str:
        return "/".join([self._path.rstrip("/"), *parts])

    def _obj(self, id_: str, *parts: str) -> str:
        return self._p("objects", id_, *parts)

    # ------------------------------------------------------------------------------------- write

    def put(self, kind: str, name: str, src_dir: str | os.PathLike, *, run_id: str, parents: list[str],
            config: dict, metrics: dict | None = None, extra: dict | None = None,
            world_size: int = 1) -> ArtifactRef:
        """Store the files under `src_dir` as one artifact; returns its handle. Same kind, content and parents
        -> same id (the existing artifact is returned as it is)."""
        if kind not in KINDS:
            raise ValueError(f"kind: {kind!r} is not one of {KINDS}")
        src = Path(src_dir)
        if not src.is_dir():
            raise FileNotFoundError(f"artifact source folder {src} does not exist")
        files = {}
        for f in sorted(p for p in src.rglob("*") if p.is_file()):
            with open(f, "rb") as fh:
                files[f.relative_to(src).as_posix()] = {"sha256": sha256_stream(fh), "size": f.stat().st_size}
        if not files:
            raise ValueError(f"artifact source folder {src} is empty")
        for pid in parents:
            if not self.exists(pid):
                raise ArtifactNotFoundError(f"parent artifact {pid} is not in the store {self.root}")
        id_ = artifact_id(kind, ((rel, meta["sha256"]) for rel, meta in files.items()), parents)
        ref = ArtifactRef(kind=kind, id=id_, name=name, store=self.root)
        if self.exists(id_):
            return ref  # same kind, content and parents: the first manifest (its run, name, config) stays
        manifest = Manifest(
            kind=kind, id=id_, name=name, run_id=run_id, parents=list(parents), config=config,
            created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            code=codeversion.code_version(), environment=codeversion.environment(world_size),
            metrics=metrics or {}, extra=extra or {}, files=files)
        if self.local:
            self._put_local(src, manifest)
        else:
            self._put_remote(src, manifest)
        self.index.add(manifest)
        return ref

    def _put_local(self, src: Path, manifest: Manifest) -> None:
        tmp_root = Path(self.root) / "tmp"
        tmp_root.mkdir(exist_ok=True)
        self._clean_stale_tmp(tmp_root)
        stage = Path(tempfile.mkdtemp(prefix=f"{manifest.id[:12]}-{os.getpid()}-", dir=tmp_root))
        linked: set[str] = set()

        def link_or_copy(src_file: str, dst_file: str) -> None:
            meta = manifest.files[Path(os.path.relpath(src_file, src)).as_posix()]
            if self._link_blob(meta, Path(dst_file)):
                linked.add(dst_file)
            else:
                shutil.copy2(src_file, dst_file)

        try:
            shutil.copytree(src, stage / "files", copy_function=link_or_copy)
            (stage / "manifest.json").write_text(manifest.to_json())
            for f in stage.rglob("*"):
                if f.is_file() and str(f) not in linked:  # a linked blob is already on disk
                    with open(f, "rb") as fh:
                        os.fsync(fh.fileno())
            (Path(self.root) / "objects").mkdir(exist_ok=True)
            try:
                os.rename(stage, Path(self.root) / "objects" / manifest.id)  # atomic on one filesystem
            except OSError:
                if not self.exists(manifest.id):  # lost a race against the same artifact: fine
                    raise
                return
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        self._add_blobs(manifest)

    def _blob(self, sha256: str) -> Path:
        return Path(self.root) / "blobs" / sha256[:2] / sha256

    def _link_blob(self, meta: dict, dst: Path) -> bool:
        """Hard-link the stored blob with this content to `dst`; False when there is none (or it no longer
        holds that content, or the filesystem has no hard links): the caller copies the file instead."""
        blob = self._blob(meta["sha256"])
        try:
            if blob.stat().st_size != meta["size"]:
                raise ValueError
            with open(blob, "rb") as fh:
                if sha256_stream(fh) != meta["sha256"]:  # edited in place: never spread it to a new artifact
                    raise ValueError
            os.link(blob, dst)
            return True
        except FileNotFoundError:
            return False
        except ValueError:
            blob.unlink(missing_ok=True)  # the next put of this content becomes the new blob
            return False
        except OSError:
            return False

    def _add_blobs(self, manifest: Manifest) -> None:
        """Record the new artifact's files as the blobs later puts link to (after the rename: a blob never
        points into a staging folder). Missing a blob only costs de-duplication, never correctness."""
        for rel, meta in manifest.files.items():
            blob = self._blob(meta["sha256"])
            if blob.exists():
                continue
            try:
                blob.parent.mkdir(parents=True, exist_ok=True)
                os.link(self._obj(manifest.id, "files", rel), blob)
            except OSError:  # FileExistsError (a concurrent writer), or no hard links on this filesystem
                pass

    @staticmethod
    def _clean_stale_tmp(tmp_root: Path) -> None:
        """Remove staging folders of writers that died (their pid is gone)."""
        for d in tmp_root.iterdir():
            try:
                pid = int(d.name.split("-")[1])
            except (IndexError, ValueError):
                continue
            if pid != os.getpid() and not _pid_alive(pid):
                shutil.rmtree(d, ignore_errors=True)

    def _put_remote(self, src: Path, manifest: Manifest) -> None:
        for rel in manifest.files:
            self.fs.makedirs(os.path.dirname(self._obj(manifest.id, "files", rel)), exist_ok=True)
            self.fs.put_file(str(src / rel), self._obj(manifest.id, "files", rel))
        with self.fs.open(self._obj(manifest.id, "manifest.json"), "w") as f:  # last: makes it exist
            f.write(manifest.to_json())

    # ------------------------------------------------------------------------------------- read

    def exists(self, id_: str) -> bool:
        return self.fs.exists(self._obj(id_, "manifest.json"))

    def manifest(self, ref_or_id: ArtifactRef | str) -> Manifest:
        id_ = self.resolve(ref_or_id.id if isinstance(ref_or_id, ArtifactRef) else ref_or_id)
        with self.fs.open(self._obj(id_, "manifest.json"), "r") as f:
            return Manifest.from_json(f.read())

    def ref(self, id_or_prefix: str) -> ArtifactRef:
        m = self.manifest(id_or_prefix)
        return ArtifactRef(kind=m.kind, id=m.id, name=m.name, store=self.root)

    def get(self, ref_or_id: ArtifactRef | str, verify: bool = True) -> Path:
        """A local folder holding the artifact's files (downloaded for remote stores), hashes verified."""
        m = self.manifest(ref_or_id)
        if self.local:
            path = Path(self._obj(m.id, "files"))
        else:
            path = Path.home() / ".cache" / "posttrain" / "objects" / m.id / "files"
            if not path.exists():
                stage = Path(tempfile.mkdtemp(dir=path.parent.parent if path.parent.parent.exists() else None))
                for rel in m.files:
                    (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                    self.fs.get_file(self._obj(m.id, "files", rel), str(stage / rel))
                path.parent.mkdir(parents=True, exist_ok=True)
                os.rename(stage, path)
        if verify:
            self._verify_dir(m, path)
        return path

    def verify(self, ref_or_id: ArtifactRef | str) -> Manifest:
        """Re-hash every stored file; raises ArtifactIntegrityError naming the first bad file."""
        m = self.manifest(ref_or_id)
        for rel, meta in m.files.items():
            p = self._obj(m.id, "files", rel)
            if not self.fs.exists(p):
                raise ArtifactIntegrityError(f"artifact {m.id[:12]} ({m.kind} {m.name}): file {rel} is missing")
            with self.fs.open(p, "rb") as f:
                if sha256_stream(f) != meta["sha256"]:
                    raise ArtifactIntegrityError(
                        f"artifact {m.id[:12]} ({m.kind} {m.name}): file {rel} does not match its sha256 in the "
                        f"manifest (expected {meta['sha256'][:16]}...) - it was modified or corrupted")
        return m

    def _verify_dir(self, m: Manifest, path: Path) -> None:
        for rel, meta in m.files.items():
            f = path / rel
            if not f.is_file():
                raise ArtifactIntegrityError(f"artifact {m.id[:12]} ({m.kind} {m.name}): file {rel} is missing")
            with open(f, "rb") as fh:
                if sha256_stream(fh) != meta["sha256"]:
                    raise ArtifactIntegrityError(
                        f"artifact {m.id[:12]} ({m.kind} {m.name}): file {rel} does not match its sha256 in the "
                        f"manifest - it was modified or corrupted ({f})")

    def resolve(self, id_or_prefix: str) -> str:
        """The full id for an id or a unique prefix of one."""
        if len(id_or_prefix) == 64 and self.exists(id_or_prefix):
            return id_or_prefix
        matches = [i for i in self._ids() if i.startswith(id_or_prefix)] if id_or_prefix else []
        if not matches:
            raise ArtifactNotFoundError(f"no artifact with id {id_or_prefix!r} in the store {self.root}")
        if len(matches) > 1:
            raise ArtifactNotFoundError(f"id prefix {id_or_prefix!r} is ambiguous: {[m[:12] for m in matches]}")
        return matches[0]

    def _ids(self) -> list[str]:
        base = self._p("objects")
        if not self.fs.exists(base):
            return []
        return sorted(os.path.basename(p.rstrip("/")) for p in self.fs.ls(base, detail=False)
                      if self.fs.exists(p.rstrip("/") + "/manifest.json"))

    def _all_manifests(self) -> list[Manifest]:
        return [self.manifest(i) for i in self._ids()]

    # ------------------------------------------------------------------------------------- query

    def list(self, kind: str | None = None, run_id: str | None = None, child_of: str | None = None) -> list[Manifest]:
        """Manifests, oldest first; `child_of`: only artifacts made from that one (it is among their parents)."""
        return [self.manifest(i) for i in self.index.ids(kind=kind, run_id=run_id, child_of=child_of)
                if self.exists(i)]

    def lineage(self, ref_or_id: ArtifactRef | str) -> LineageNode:
        def node(id_: str, seen: frozenset) -> LineageNode:
            m = self.manifest(id_)
            parents = [node(p, seen | {id_}) for p in m.parents if p not in seen]
            return LineageNode(manifest=m, parents=parents)

        return node(self.manifest(ref_or_id).id, frozenset())

    def rebuild_index(self) -> int:
        return self.index.rebuild()

    # ------------------------------------------------------------------------------------- cache

    cache_key = staticmethod(_cache_key)

    def cache_get(self, key: str) -> ArtifactRef | None:
        """The artifact recorded for `key`, or None when absent or no longer intact in the store."""
        path = self._p("cache", f"{key}.json")
        if not self.fs.exists(path):
            return None
        import json

        with self.fs.open(path, "r") as f:
            entry = json.load(f)
        if not self.exists(entry["id"]):
            return None
        try:
            self._check_sizes(self.manifest(entry["id"]))
        except ArtifactIntegrityError:
            return None
        return ArtifactRef(kind=entry["kind"], id=entry["id"], name=entry["name"], store=self.root)

    def _check_sizes(self, m: Manifest) -> None:
        for rel, meta in m.files.items():
            p = self._obj(m.id, "files", rel)
            if not self.fs.exists(p) or self.fs.size(p) != meta["size"]:
                raise ArtifactIntegrityError(f"artifact {m.id[:12]}: file {rel} is missing or truncated")

    def cache_put(self, key: str, ref: ArtifactRef) -> None:
        import json

        self.fs.makedirs(self._p("cache"), exist_ok=True)
        tmp = self._p("cache", f"{key}.json.{uuid.uuid4().hex}")
        with self.fs.open(tmp, "w") as f:
            json.dump({"id": ref.id, "kind": ref.kind, "name": ref.name}, f)
        self.fs.mv(tmp, self._p("cache", f"{key}.json"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
