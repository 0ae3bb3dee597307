"""`microscale quantize --part I/N`: a quantization split across processes.

Every output file of a split run must equal, byte for byte, the same file of a single-process run
(the oracle here is the single-process output, itself checked against the reference packages in
test_checkpoint_cli.py); a part that fails or is killed must leave nothing that looks complete.
Uses the command built in build/ or the one $MICROSCALE_CLI names; skipped without one.
"""

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from ckpt_support import CLI, make_tensors, skip_without_cli, write_model

pytest.importorskip("safetensors")

skip_without_cli()

# Launcher variables of the test's own environment must not leak into the parts.
LAUNCHER_VARS = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
                 "SLURM_NTASKS", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(extra)
    return env


def run(*args, ok=True, env=None):
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, errors="replace", timeout=300,
                       env=env or clean_env())
    if ok:
        assert r.returncode == 0, f"{args}: {r.stderr}"
    return r


def tree(d):
    """{relative path: bytes} of every file under d, hidden ones included."""
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = fh.read()
    return out


def assert_same_tree(got, want):
    g, w = tree(got), tree(want)
    assert sorted(g) == sorted(w)
    for name in w:
        assert g[name] == w[name], f"{name} differs from the single-process run's"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """Six shards of four tensors: layer 0's q_proj and k_proj, and its gate_proj and up_proj, fall
    into different shards, so two parts share each of those fused groups' global scale."""
    d = tmp_path_factory.mktemp("model")
    write_model(str(d), make_tensors(layers=2), shards=6)
    with open(d / "model.safetensors.index.json") as f:
        where = json.load(f)["weight_map"]
    shard = {n: int(f.split("-")[1]) - 1 for n, f in where.items()}
    for a, b in [("self_attn.q_proj", "self_attn.k_proj"), ("mlp.gate_proj", "mlp.up_proj")]:
        sa, sb = shard[f"model.layers.0.{a}.weight"], shard[f"model.layers.0.{b}.weight"]
        assert sa % 2 != sb % 2, "the fixture must split a fused group across the two parts"
    return d


def single(src, out, *opts):
    run("quantize", src, "-o", out, *opts)
    return out


def wait_all(procs):
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    for rc, err in results:
        assert rc == 0, err


SPLITS = [("nvfp4", "compressed-tensors"), ("nvfp4", "modelopt"), ("mxfp4", "compressed-tensors"),
          ("affine4", "mlx")]


@pytest.mark.parametrize("fmt,export", SPLITS, ids=[f"{f}-{e}" for f, e in SPLITS])
def test_two_concurrent_parts_equal_a_single_run(model, tmp_path, fmt, export):
    opts = ["--format", fmt, "--export", export]
    want = single(model, tmp_path / "single", *opts)
    out = tmp_path / "split"
    procs = [subprocess.Popen([CLI, "quantize", str(model), "-o", str(out), *opts, "--part", f"{i}/2"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
             for i in range(2)]
    wait_all(procs)
    assert_same_tree(out, want)
    assert sorted(os.listdir(tmp_path)) == ["single", "split"]  # no staging directory left


def test_parts_in_any_order_and_more_parts_than_shards(model, tmp_path):
    want = single(model, tmp_path / "single")
    out = tmp_path / "split"
    for i in reversed(range(8)):  # 8 parts over 6 shards: two write none
        r = run("quantize", model, "-o", out, "--part", f"{i}/8")
        assert os.path.isdir(out) == (i == 0), "published only once every part is done"
        assert ("had no shard to write" in r.stdout) == (i >= 6)
    assert_same_tree(out, want)


def test_single_file_source(tmp_path):
    src = tmp_path / "src"
    write_model(str(src), make_tensors(layers=1), shards=1)
    want = single(src, tmp_path / "single")
    out = tmp_path / "split"
    run("quantize", src, "-o", out, "--part", "1/2")
    run("quantize", src, "-o", out, "--part", "0/2")
    assert_same_tree(out, want)


def test_part_auto_reads_the_launcher_environment(model, tmp_path):
    want = single(model, tmp_path / "single")
    launchers = {
        "ompi": lambda i: {"OMPI_COMM_WORLD_RANK": str(i), "OMPI_COMM_WORLD_SIZE": "2"},
        "pmi": lambda i: {"PMI_RANK": str(i), "PMI_SIZE": "2"},
        "srun": lambda i: {"SLURM_PROCID": str(i), "SLURM_NTASKS": "2"},
        # An array job --array=1-2: each task is one Slurm task of its own, numbered from MIN.
        "array": lambda i: {"SLURM_ARRAY_TASK_ID": str(i + 1), "SLURM_ARRAY_TASK_MIN": "1",
                            "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"},
    }
    for name, env in launchers.items():
        out = tmp_path / name
        r = run("quantize", model, "-o", out, "--part", "auto", env=clean_env(**env(1)))
        assert "part 1 of 2" in r.stdout and not os.path.exists(out), name
        r = run("quantize", model, "-o", out, "--part", "auto", env=clean_env(**env(0)))
        assert "part 0 of 2 finished last" in r.stdout, name
        assert_same_tree(out, want)


def test_under_mpirun(model, tmp_path):
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.skip("no mpirun (apt-get install openmpi-bin)")
    want = single(model, tmp_path / "single")
    out = tmp_path / "split"
    # Open MPI refuses to start as root unless told that it is meant.
    env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_plm_rsh_agent="")
    r = subprocess.run([mpirun, "-n", "2", "--oversubscribe", CLI, "quantize", str(model), "-o", str(out),
                        "--part", "auto"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "part 0 of 2" in r.stdout and "part 1 of 2" in r.stdout
    assert_same_tree(out, want)


@pytest.mark.parametrize("part,msg", [("0/0", "at least 1"), ("3/2", "must be 0 to 1"), ("x", "expected I/N"),
                                      ("1", "expected I/N"), ("-1/2", "must be 0 to 1"),
                                      ("auto", "no launcher rank")])
def test_bad_part_values(model, tmp_path, part, msg):
    out = tmp_path / "out"
    r = run("quantize", model, "-o", out, f"--part={part}", ok=False)
    assert r.returncode != 0
    assert f"--part {part}" in r.stderr and msg in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []  # nothing written, no staging directory


@pytest.mark.parametrize("var,value", [("SLURM_ARRAY_TASK_MIN", "-2147483648"), ("SLURM_ARRAY_TASK_MIN", "1x"),
                                       ("SLURM_ARRAY_TASK_MIN", "99999999999"), ("SLURM_ARRAY_TASK_ID", "2147483648"),
                                       ("SLURM_ARRAY_TASK_COUNT", "-2"), ("OMPI_COMM_WORLD_RANK", "+1"),
                                       ("PMI_SIZE", "")])
def test_bad_launcher_values_are_named(model, tmp_path, var, value):
    env = {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "2"}
    if var.startswith("OMPI"):
        env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
    if var.startswith("PMI"):
        env = {"PMI_RANK": "0", "PMI_SIZE": "2"}
    env[var] = value
    r = run("quantize", model, "-o", tmp_path / "out", "--part", "auto", ok=False, env=clean_env(**env))
    assert r.returncode == 1, r.stderr
    assert f"{var}='{value}'" in r.stderr and "is not a rank, size or task id" in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []


def test_huge_part_count_costs_what_exists(model, tmp_path):
    """A part count far above the shard count (a typo, say) must not make each later run look for
    every part's marker: 2^31 - 1 parts used to mean 2^31 stat calls per command."""
    out, n = tmp_path / "out", 2**31 - 1

    def timed(*args):
        return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, errors="replace", timeout=60,
                              env=clean_env())

    r = timed("quantize", model, "-o", out, "--part", f"{n - 1}/{n}")
    assert r.returncode == 0 and "had no shard to write" in r.stdout, r.stderr
    r = timed("quantize", model, "-o", out, "--force")
    assert r.returncode == 1 and f"part {n - 1} of {n} is done" in r.stderr, r.stderr
    r = timed("quantize", model, "-o", out, "--part", f"0/{n}")  # writes shard 0, finds the others missing
    assert r.returncode == 0 and not os.path.exists(out), r.stderr
    r = timed("quantize", model, "-o", out)
    assert r.returncode == 1 and f"parts 0, {n - 1} of {n} are done" in r.stderr, r.stderr


def test_parts_must_agree(model, tmp_path):
    out = tmp_path / "out"
    run("quantize", model, "-o", out, "--part", "0/3")
    staging = tmp_path / ".out.tmp.parts"
    for args, msg in [(["--part", "1/2"], "started with --part .../3"),
                      (["--part", "1/3", "--format", "mxfp4"], "other options"),
                      (["--part", "1/3", "--separate-fused-scales"], "other options")]:
        r = run("quantize", model, "-o", out, *args, ok=False)
        assert r.returncode != 0 and msg in r.stderr and str(staging) in r.stderr, r.stderr
    other = tmp_path / "other"
    write_model(str(other), make_tensors(layers=2, seed=1), shards=6)  # same layout, other weights
    r = run("quantize", other, "-o", out, "--part", "1/3", ok=False)
    assert "another source checkpoint" in r.stderr, r.stderr
    assert not os.path.exists(out)


def test_killed_part_leaves_nothing_that_looks_complete(tmp_path):
    src = tmp_path / "src"
    write_model(str(src), make_tensors(layers=1, hidden=1024, inter=8192, kv=256), shards=2)
    old = single(src, tmp_path / "out", "--format", "affine8")  # a previous output, replaced with --force
    old_files = tree(old)
    out, staging = tmp_path / "out", tmp_path / ".out.tmp.parts"
    run("quantize", src, "-o", out, "--force", "--part", "0/2")

    quantized = tmp_path / "quantized"
    shutil.copytree(out, quantized)
    # The scalar reference backend and --errors (neither changes the bytes) keep the part writing
    # for a second or so, time enough to catch it there.
    p = subprocess.Popen([CLI, "quantize", str(src), "-o", str(out), "--force", "--part", "1/2", "--errors"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=clean_env(MICROSCALE_BACKEND="reference"))
    deadline = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < deadline:
        if any(".safetensors.tmp." in f for f in os.listdir(staging)):
            break
        time.sleep(0.001)
    assert p.poll() is None, "the part finished before it could be killed"
    p.send_signal(signal.SIGKILL)
    p.wait()

    assert tree(out) == old_files  # the old output, untouched
    for args in (["quantize", src, "-o", out, "--force"], ["convert", quantized, "-o", out, "--to", "mlx", "--force"],
                 ["dequantize", quantized, "-o", out, "--force"]):
        r = run(*args, ok=False)
        assert r.returncode != 0 and "unfinished" in r.stderr and "part 0 of 2 is done" in r.stderr, (args, r.stderr)
    r = run("inspect", staging, ok=False)
    assert r.returncode != 0 and "unfinished" in r.stderr
    assert not os.path.exists(staging / "config.json")  # loaders find nothing to load there

    run("quantize", src, "-o", out, "--force", "--part", "1/2")  # the same command again resumes
    assert_same_tree(out, single(src, tmp_path / "single"))
    assert sorted(os.listdir(tmp_path)) == ["out", "quantized", "single", "src"]
