"""Launch the pipeline on a Flyte cluster with KubeRay and the Kubeflow training operator: the three steps a platform
engineer runs, in order, with one set of names (docs/cluster.md has what each part needs from the cluster).

    .venv/bin/python examples/cluster/launch.py --registry ghcr.io/acme --project posttrain --domain development \\
        --home s3://acme-ml/posttrain --recipe tiny_cpu --overrides '{"rl": {"steps": 50}}'
    .venv/bin/python examples/cluster/launch.py --dry-run     # everything that needs no cluster (make test runs it)

1. **Build and push the image** (`images/specs.py`'s `cpu_image`, the exact pins of requirements.lock) to
   `--registry` with flytekit's ImageSpec builder (docker): skipped when the registry already holds that tag
   (the tag is a hash of the spec, so a changed lock builds a new image). A registry that cannot be asked fails
   here (FLYTE_IMG_FAST_FAIL) instead of registering tasks whose image may not exist.
2. **Register** the workflows and launch plans (`workflows/`: 39 entities) in `--project` / `--domain` as
   `--version` (default: the git commit, `-dirty` with uncommitted changes), with `POSTTRAIN_HOME` = `--home`
   baked into every task: every pod and Ray node reads and writes the artifacts there (with the cluster's
   credentials for it). `--activate-launchplans` starts the nightly schedule (workflows/launch_plans.py).
   The sizes the tasks declare are read here, at registration, from the environment (tasks/settings.py):
   POSTTRAIN_SFT_NNODES > 1 makes `sft` a PyTorchJob, POSTTRAIN_RAY_TRAIN_REPLICAS / _ROLLOUT_REPLICAS size the
   RayJob's worker groups, POSTTRAIN_RAY_SHM its /dev/shm.
3. **Run** `--workflow` with `--recipe` and `--overrides` (JSON, as `pyflyte run --overrides`): the recipe and
   overrides are validated here first (the plan's own checks: a bad setting fails before anything is sent), then
   an execution of exactly the registered version starts (FlyteRemote); its URL is printed.

`--dry-run` does all of it that needs no cluster: it validates the run's recipe and overrides, names the image a
launch builds without building it, and registers with `pyflyte register --dry-run --copy none`, so every task and
workflow is compiled and counted (a fast registration asks the cluster for an upload URL even in a dry run:
"Failed to get signed url"). Without fast registration flytekit copies the code into the tasks' image, so the tag
the dry run's tasks name differs from the launch's; a launch registers fast (the code is uploaded, the image
holds the pinned libraries only), and its tasks name the image step 1 built. tests/integration/test_readme_commands.py runs it as docs/cluster.md gives it.
The Flyte endpoint and credentials come from `--config` (default: FLYTECTL_CONFIG or ~/.flyte/config.yaml).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYFLYTE = str(Path(sys.executable).parent / "pyflyte")


def git_version() -> str:
    """The checkout's commit (12 hex digits), with `-dirty` when files differ from it."""
    sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.strip()
    return f"{sha}-dirty" if dirty else sha


def image(registry: str, build: bool) -> str:
    """The image's full name in `registry`; `build`: build and push it unless the registry has it."""
    os.environ["POSTTRAIN_REGISTRY"] = registry  # images/specs.py reads it at import; tasks/ import it too
    sys.path.insert(0, str(ROOT))  # images/ is the checkout's, not an installed package
    from flytekit.image_spec.image_spec import ImageBuildEngine

    from images.specs import cpu_image

    if build:
        os.environ["FLYTE_IMG_FAST_FAIL"] = "true"
        ImageBuildEngine.build(cpu_image)
    return cpu_image.image_name()


def register(args: argparse.Namespace, image_name: str) -> None:
    """`pyflyte register` of workflows/; raises with pyflyte's output when it fails."""
    cmd = [PYFLYTE, *(["-c", args.config] if args.config else []), "register", "--project", args.project,
           "--domain", args.domain, "--image", image_name, "--version", args.version,
           "--env", f"POSTTRAIN_HOME={args.home}"]
    cmd += ["--dry-run", "--copy", "none"] if args.dry_run else []
    cmd += ["--activate-launchplans"] if args.activate_launchplans else []
    print("+", " ".join(cmd[1:]), flush=True)
    out = subprocess.run([*cmd, "workflows/"], cwd=ROOT, env={**os.environ, "POSTTRAIN_REGISTRY": args.registry},
                         check=False)
    if out.returncode:
        raise SystemExit(f"launch: registration failed (pyflyte register exited {out.returncode}); its output is above")


def check_run(args: argparse.Namespace) -> None:
    """The run's recipe and overrides through the plan's own validation (posttrain.recipes.resolve)."""
    from posttrain.config import ConfigError
    from posttrain.recipes import resolve

    try:
        resolve(args.recipe, args.overrides, workflow=args.workflow)
    except ConfigError as e:
        raise SystemExit(f"launch: the run's settings are refused: {e}") from None


def run(args: argparse.Namespace) -> None:
    """An execution of the registered workflow version; prints its URL."""
    from flytekit.configuration import Config
    from flytekit.remote import FlyteRemote

    remote = FlyteRemote(Config.auto(config_file=args.config), default_project=args.project,
                         default_domain=args.domain)
    wf = remote.fetch_workflow(name=f"workflows.pipeline.{args.workflow}", version=args.version)
    ex = remote.execute(wf, inputs={"recipe": args.recipe, "overrides": args.overrides, "run_id": args.run_id},
                        wait=False)
    print(f"launch: started {ex.id.name}: {remote.generate_console_url(ex)}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--registry", default=os.environ.get("POSTTRAIN_REGISTRY", "localhost:30000"),
                    help="where the image is pushed (default: $POSTTRAIN_REGISTRY or a Flyte sandbox's localhost:30000)")
    ap.add_argument("--project", default="posttrain", help="Flyte project (default: posttrain)")
    ap.add_argument("--domain", default="development", help="Flyte domain (default: development)")
    ap.add_argument("--version", help="the registered version (default: the git commit, -dirty if changed)")
    ap.add_argument("--home", help="the artifact store every pod reaches, e.g. s3://bucket/posttrain "
                                   "(required, but for --dry-run)")
    ap.add_argument("--workflow", default="pipeline", help="workflow of workflows/pipeline.py (default: pipeline)")
    ap.add_argument("--recipe", default="tiny_cpu", help="the run's recipe (default: tiny_cpu)")
    ap.add_argument("--overrides", default="", help="the run's settings as JSON, as `pyflyte run --overrides`")
    ap.add_argument("--run-id", default="", help="the run's id in the store (default: the plan makes one)")
    ap.add_argument("--config", help="flytectl config (default: $FLYTECTL_CONFIG or ~/.flyte/config.yaml)")
    ap.add_argument("--activate-launchplans", action="store_true", help="start the nightly schedule")
    ap.add_argument("--skip-build", action="store_true", help="the image is already in the registry")
    ap.add_argument("--dry-run", action="store_true", help="no cluster: no build, a register dry run, no execution")
    args = ap.parse_args(argv)
    if not args.home:
        if not args.dry_run:
            ap.error("--home is required: the artifact store every pod and Ray node reaches (s3://bucket/posttrain)")
        args.home = "s3://bucket/posttrain"
    if args.version is None:
        args.version = "dry-run" if args.dry_run else git_version()
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    check_run(args)  # first: a refused setting costs no build and no registration
    image_name = image(args.registry, build=not (args.dry_run or args.skip_build))
    print(f"launch: image {image_name}" + (" (not built: dry run)" if args.dry_run else ""), flush=True)
    register(args, image_name)
    if args.dry_run:
        print(f"launch: dry run - would start workflows.pipeline.{args.workflow} version {args.version} in "
              f"{args.project}/{args.domain} with recipe {args.recipe!r}, overrides {args.overrides or '{}'}")
        return
    run(args)


if __name__ == "__main__":
    main()
