"""What the `microscale` command writes, and where it refuses to: report files (--errors-csv, eval's
--csv / --svg) that would land on the run's own inputs, the files copied beside the weights
(symbolic links, permissions, nested models), and options that used to be ignored.

Each refusal must exit 1 naming the option or file, leave every input byte-identical and leave no
output or staging directory behind. Table-driven: the collisions enumerate every input a run reads
(the checks live in the CLI and RunInputs, which tests/fuzz/fuzz_checkpoint.cpp also drives).
Uses the command built in build/ or the one $MICROSCALE_CLI names; skipped without one.
"""

import hashlib
import json
import os
import re
import stat

import numpy as np
import pytest

from ckpt_support import BF16, make_tensors, run, skip_without_cli, write_model

pytest.importorskip("safetensors")

skip_without_cli()


def snapshot(*roots):
    """{path: (mode, sha256 or link target)} of every file, link and folder under roots."""
    out = {}
    for root in roots:
        root = str(root)
        if os.path.isfile(root) or os.path.islink(root):
            paths = [root]
        else:
            paths = [root]
            for d, dirs, files in os.walk(root):
                paths += [os.path.join(d, n) for n in dirs + files]
        for p in paths:
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[p] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[p] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                with open(p, "rb") as f:
                    out[p] = (stat.S_IMODE(st.st_mode), hashlib.sha256(f.read()).hexdigest())
    return out


def refused(args, *, names, untouched, quiet_dir):
    """Runs args, which must fail with exit 1 naming each of `names`, leave `untouched` exactly as it
    was and add nothing to `quiet_dir`."""
    before, listing = snapshot(*untouched), sorted(os.listdir(quiet_dir))
    r = run(*args)
    assert r.returncode == 1, f"{args}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stderr.startswith("microscale: error:"), r.stderr
    for n in names:
        assert str(n) in r.stderr, (n, r.stderr)
    assert snapshot(*untouched) == before, "an input changed"
    assert sorted(os.listdir(quiet_dir)) == listing, "something was left behind"
    return r


@pytest.fixture
def work(tmp_path):
    """A two-shard model, a Hessians file for one layer and an activation-amax file."""
    from safetensors.numpy import save_file

    model = tmp_path / "model"
    write_model(str(model), make_tensors(layers=1), shards=2)
    hess = tmp_path / "h.safetensors"
    save_file({"model.layers.0.mlp.down_proj": np.eye(256, dtype=np.float32)}, str(hess))
    amax = tmp_path / "amax.json"
    amax.write_text(json.dumps({"model.layers.0.mlp.down_proj": 1.0}))
    return tmp_path, model, hess, amax


SHARD = "model-00001-of-00002.safetensors"
# Where --errors-csv points, relative to the test folder; each is an input of the run, or in its folder.
COLLISIONS = [SHARD, "model/model-00002-of-00002.safetensors", "model/model.safetensors.index.json",
              "model/config.json", "model/tokenizer.json", "model/extra/notes.txt", "model/new-report.csv",
              "h.safetensors", "amax.json", "link-to-shard", "hardlink-to-shard", "model/../model/config.json"]


@pytest.mark.parametrize("target", COLLISIONS)
def test_errors_csv_never_replaces_an_input(work, target):
    tmp, model, hess, amax = work
    os.symlink(model / SHARD, tmp / "link-to-shard")
    os.link(model / SHARD, tmp / "hardlink-to-shard")
    report = tmp / ("model/" + target if target == SHARD else target)
    args = ["quantize", model, "-o", tmp / "out", "--errors-csv", report]
    if target == "h.safetensors":
        args += ["--hessians", hess]
    if target == "amax.json":
        args += ["--activation-amax", amax]
    refused(args, names=["--errors-csv"], untouched=[tmp], quiet_dir=tmp)


def test_errors_csv_on_a_hugging_face_cache_blob(tmp_path):
    """Snapshot files link into the repository's blobs/: a report on a blob is refused by identity."""
    repo = tmp_path / "hub" / "models--org--tiny"
    model = write_hf_cache(repo, make_tensors(layers=1))
    blob = os.path.realpath(model / "model.safetensors")
    refused(["quantize", model, "-o", tmp_path / "out", "--errors-csv", blob], names=["--errors-csv", "shard"],
            untouched=[tmp_path], quiet_dir=tmp_path)


def test_errors_csv_is_not_the_output_directory(work):
    tmp, model, _, _ = work
    for out in (tmp / "out", str(tmp / "out") + "/"):
        refused(["quantize", model, "-o", out, "--errors-csv", tmp / "out"], names=["--errors-csv", "-o"],
                untouched=[tmp], quiet_dir=tmp)


def test_output_directory_never_holds_an_input(work):
    """--force replaces the output directory whole, dropping its checkpoint files: one holding the
    --hessians file, or the model itself, would delete them."""
    tmp, model, hess, _ = work
    prev = tmp / "prev"
    assert run("quantize", model, "-o", prev).returncode == 0
    os.replace(hess, prev / "h.safetensors")
    refused(["quantize", model, "-o", prev, "--force", "--hessians", prev / "h.safetensors"],
            names=["output directory", "--hessians file"], untouched=[tmp], quiet_dir=tmp)
    os.replace(prev / "h.safetensors", hess)  # the test folder now holds a checkpoint file, and the model
    staging = [f for f in os.listdir(tmp.parent) if f.startswith("." + tmp.name)]
    refused(["quantize", model, "-o", tmp, "--force"], names=["holds the model directory"], untouched=[tmp],
            quiet_dir=tmp)
    assert [f for f in os.listdir(tmp.parent) if f.startswith("." + tmp.name)] == staging


@pytest.mark.parametrize("option", ["--csv", "--svg"])
@pytest.mark.parametrize("target", [SHARD, "config.json", "tokenizer.json", "eval.csv"])
def test_eval_reports_never_replace_an_input(work, option, target):
    tmp, model, _, _ = work
    other = "--svg" if option == "--csv" else "--csv"
    refused(["eval", model, "--modes", "mxfp4", "--repeats", "1", option, model / target, other, tmp / "other"],
            names=[option], untouched=[tmp], quiet_dir=tmp)


def test_eval_single_file_protects_the_file_only(tmp_path):
    model = tmp_path / "m"
    write_model(str(model), make_tensors(layers=1), shards=1)
    refused(["eval", model / "model.safetensors", "--modes", "mxfp4", "--repeats", "1", "--csv",
             model / "model.safetensors", "--svg", tmp_path / "p.svg"], names=["--csv"], untouched=[tmp_path],
            quiet_dir=tmp_path)
    r = run("eval", model / "model.safetensors", "--modes", "mxfp4", "--repeats", "1", "--csv", model / "e.csv",
            "--svg", tmp_path / "p.svg")
    assert r.returncode == 0, r.stderr
    assert (model / "e.csv").read_text().startswith("matrix,mode")


# ---- side files copied into outputs


def write_hf_cache(repo, tensors, extra_links=()):
    """A Hugging Face hub cache repository: blobs/<hash> files, and snapshots/<rev>/ holding links
    to them (../../blobs/<hash>), as huggingface_hub writes it. Returns the snapshot folder."""
    src = repo.parent / "plain"
    write_model(str(src), tensors, shards=1)
    snap = repo / "snapshots" / "0123abcd"
    os.makedirs(repo / "blobs")
    os.makedirs(snap)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        data = (src / name).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / digest).write_bytes(data)
        os.symlink(os.path.join("..", "..", "blobs", digest), snap / name)
    for name, target in extra_links:
        os.symlink(target, snap / name)
    return snap


def test_side_file_links_stay_in_the_model_directory(tmp_path):
    model, secret = tmp_path / "model", tmp_path / "secret"
    write_model(str(model), make_tensors(layers=1), shards=1)
    secret.write_bytes(b"ssh-ed25519 private key\n")
    os.symlink("../secret", model / "tokenizer_config.json")
    os.symlink(str(secret), model / "special_tokens_map.json")
    os.symlink("../..", model / "extra" / "up")
    os.symlink("missing.txt", model / "dangling.txt")
    os.symlink("extra/notes.txt", model / "notes-link.txt")  # stays inside: copied by content
    private = model / "private.txt"
    private.write_text("only mine\n")
    os.chmod(private, 0o600)
    os.chmod(model / "tokenizer.json", 0o640)
    before = snapshot(tmp_path / "model", secret)
    for cmd in (["quantize", model, "-o", tmp_path / "q"],):
        r = run(*cmd)
        assert r.returncode == 0, r.stderr
        out = cmd[3]
        files = {os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out) for f in fs}
        for d, _, fs in os.walk(out):
            for f in fs:
                assert b"private key" not in open(os.path.join(d, f), "rb").read(), f
        for link in ("tokenizer_config.json", "special_tokens_map.json", "dangling.txt", "extra/up"):
            assert link not in files and not os.path.lexists(out / link), link
        notes = [ln for ln in r.stdout.splitlines() if "symbolic links" in ln]
        assert len(notes) == 1 and "tokenizer_config.json -> ../secret" in notes[0], r.stdout
        assert str(secret) in notes[0] and "dangling.txt" in notes[0] and "extra/up" in notes[0]
        assert (out / "notes-link.txt").read_text() == "copied along\n" and not os.path.islink(out / "notes-link.txt")
        assert stat.S_IMODE(os.stat(out / "private.txt").st_mode) == 0o600
        assert stat.S_IMODE(os.stat(out / "tokenizer.json").st_mode) == 0o640
    assert snapshot(tmp_path / "model", secret) == before


def test_hugging_face_cache_snapshot_links_are_followed(tmp_path):
    repo = tmp_path / "hub" / "models--org--tiny"
    (tmp_path / "secret").write_text("not the model's\n")
    snap = write_hf_cache(repo, make_tensors(layers=1),
                          extra_links=[("vocab.txt", "../../../../secret"), ("merges.txt", "../../refs")])
    (repo / "refs").mkdir()
    out = tmp_path / "q"
    r = run("quantize", snap, "-o", out)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    assert not os.path.lexists(out / "vocab.txt") and not os.path.lexists(out / "merges.txt")
    assert "vocab.txt -> ../../../../secret" in r.stdout and "merges.txt" in r.stdout


def test_an_earlier_output_inside_the_input_is_not_copied(tmp_path):
    model = tmp_path / "model"
    write_model(str(model), make_tensors(layers=1), shards=1)
    assert run("quantize", model, "-o", model / "q").returncode == 0
    r = run("quantize", model, "-o", model / "q2", "--format", "mxfp4")
    assert r.returncode == 0, r.stderr
    assert not os.path.lexists(model / "q2" / "q"), os.listdir(model / "q2")
    assert "q/" in r.stdout and "a model of their own" in r.stdout, r.stdout
    assert (model / "q2" / "extra" / "notes.txt").exists()  # the model's own folders still are


def test_model_file_and_index_side_by_side_is_refused(tmp_path):
    from safetensors.numpy import save_file

    model = tmp_path / "model"
    t = make_tensors(layers=1)
    write_model(str(model), t, shards=2)
    save_file({"stale.weight": np.zeros((4, 16), BF16)}, str(model / "model.safetensors"))
    for cmd in (["quantize", model, "-o", tmp_path / "q"], ["inspect", model], ["eval", model, "--no-files"]):
        refused(cmd, names=["model.safetensors", "model.safetensors.index.json"], untouched=[tmp_path],
                quiet_dir=tmp_path)
    # Naming the index picks it: the file beside it is no shard, so it is neither read nor copied.
    assert run("quantize", model / "model.safetensors.index.json", "-o", tmp_path / "q").returncode == 0
    assert not (tmp_path / "q" / "model.safetensors").exists()


def test_index_pointing_at_a_non_safetensors_file(tmp_path):
    model = tmp_path / "model"
    write_model(str(model), make_tensors(layers=1), shards=2)
    idx = model / "model.safetensors.index.json"
    j = json.loads(idx.read_text())
    name = next(iter(j["weight_map"]))
    j["weight_map"][name] = "config.json"
    idx.write_text(json.dumps(j))
    for cmd in (["quantize", model, "-o", tmp_path / "q"], ["inspect", model]):
        r = refused(cmd, names=["config.json", name, "not a .safetensors file"], untouched=[tmp_path],
                    quiet_dir=tmp_path)
        assert "weight_map" in r.stderr


# ---- options that were ignored or misread


@pytest.mark.parametrize("args,names", [
    (["--gptq-damp", "-5"], ["--gptq-damp", "--hessians"]),
    (["--gptq-block-size", "7"], ["--gptq-block-size", "--hessians"]),
    (["--gptq-damp", "-5", "--hessians", "H"], ["--gptq-damp -5"]),
    (["--gptq-block-size", "7", "--hessians", "H"], ["--gptq-block-size 7", "group size 16"]),
    (["--gptq-block-size", "0", "--hessians", "H"], ["--gptq-block-size 0"]),
    (["--group-size", "0"], ["--group-size 0"]),
    (["--group-size", "-64", "--format", "affine4"], ["--group-size -64"]),
    (["-o", ""], ["empty path"]),
])
def test_bad_options_are_refused_by_name(work, args, names):
    tmp, model, hess, _ = work
    args = [str(hess) if a == "H" else a for a in args]
    out = [] if "-o" in args else ["-o", tmp / "out"]
    refused(["quantize", model, *out, *args], names=names, untouched=[tmp], quiet_dir=tmp)
    if "--hessians" in args:  # the same run with valid values
        fixed = [{"-5": "0.1", "7": "32", "0": "32"}.get(a, a) for a in args]
        r = run("quantize", model, "-o", tmp / "out", *fixed)
        assert r.returncode == 0 and "GPTQ for 1 of" in r.stdout, r.stderr


def test_eval_modes_parsing():
    for modes, message in [("", "--modes"), (",,,", "--modes"), (" , ", "--modes"),
                           ("mxfp4,,bogus", "unknown mode 'bogus'")]:
        r = run("eval", "--modes", modes, "--rows", "8", "--cols", "128", "--no-files")
        assert r.returncode != 0 and message in r.stderr, (modes, r.stdout, r.stderr)
        assert "--rows" not in r.stderr and r.stdout == "", modes  # no other option named, no table
    # Empty items beside real ones are dropped.
    r = run("eval", "--modes", "mxfp4,", "--rows", "8", "--cols", "128", "--repeats", "1", "--no-files")
    assert r.returncode == 0, r.stderr
    assert re.findall(r"^all\s+(\S+) ", r.stdout, re.M) == ["mxfp4"], r.stdout


def model_error(stdout, mode):
    """The pooled rel.error of `mode` in eval's table for a model."""
    m = re.search(rf"^model\s+{mode}\s+\S+\s+(\S+)", stdout, re.M)
    assert m, stdout
    return float(m.group(1))


def test_eval_scores_gpt2_conv1d_along_the_input_dimension(tmp_path):
    """A Conv1D weight [in, out] must score as the Linear weight [out, in] it stands for: rows of
    very different scales make groups along the wrong axis much worse."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((96, 64)) * np.logspace(-3, 1, 96)[:, None]).astype(BF16)  # [out, in]
    base = {"h.0.ln_1.weight": np.ones(64, BF16), "model.norm.weight": np.ones(64, BF16)}
    gpt2, bigcode = tmp_path / "gpt2", tmp_path / "bigcode"
    write_model(str(gpt2), {**base, "h.0.mlp.c_fc.weight": np.ascontiguousarray(w.T)}, shards=1,
                config_extra={"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    # GPT-BigCode uses the same names for Linear layers, stored [out, in].
    write_model(str(bigcode), {**base, "h.0.mlp.c_fc.weight": w}, shards=1,
                config_extra={"architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode"})
    common = ["--modes", "mxfp4,affine4-g32", "--repeats", "1", "--no-files"]
    a, b = run("eval", gpt2, *common), run("eval", bigcode, *common)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    for mode in ("mxfp4", "affine4-g32"):
        assert model_error(a.stdout, mode) == model_error(b.stdout, mode), (a.stdout, b.stdout)
    assert "Conv1D" in a.stdout and "Conv1D" not in b.stdout
