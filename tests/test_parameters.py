"""Weights as parameters (bundle format 1.1): built once into a mapped section, checked chunk by
chunk at first use, shared native code across weights, typed errors for bad sections."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX models need the 'onnx' package")

from helpers import one_kernel_bundle

import portkern  # noqa: E402
from portkern.base import framing  # noqa: E402
from portkern.base.errors import BundleTruncatedError, DigestMismatchError, MalformedBundleError  # noqa: E402
from portkern.examples.large_mlp import reference, weight_bytes, write_mlp  # noqa: E402
from portkern.jit import parameters as mapped  # noqa: E402
from portkern.portable import bundle as fmt  # noqa: E402
from portkern.portable.parameters import CHUNK_BYTES, ENTRY_ALIGNMENT  # noqa: E402

WIDTHS = (64, 512, 256, 256)
BATCH = 8
RTOL, ATOL = 1e-4, 1e-4


def build_mlp(where: Path, seed: int, external: bool = False, name: str = "mlp") -> Path:
    where.mkdir(parents=True, exist_ok=True)
    write_mlp(where / "m.onnx", WIDTHS, BATCH, seed, external)
    return one_kernel_bundle(where, "m.onnx", "mlp", bundle=name)


@pytest.fixture(scope="module")
def mlp_bundle(tmp_path_factory) -> Path:
    return build_mlp(tmp_path_factory.mktemp("mlp"), seed=1)


def inputs(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((BATCH, WIDTHS[0]), dtype=np.float32)


def test_weights_are_parameters_in_a_mapped_section_and_results_match_numpy(mlp_bundle, store):
    loaded = portkern.load(mlp_bundle, store=store)
    bundle = loaded.bundle
    assert bundle.version == (1, 2)  # parameters (1.1) and source stages (1.2)
    section, record = bundle.parameters, loaded.record("mlp")
    # every weight and bias (all >= 256 elements) is a parameter; the code carries none of them
    assert sum(p.size for p in record.parameters) == weight_bytes(WIDTHS)
    assert section.offset % 4096 == 0 and all(p.offset % ENTRY_ALIGNMENT == 0 for p in record.parameters)
    assert mlp_bundle.stat().st_size == section.offset + section.size
    assert record.stage().size < weight_bytes(WIDTHS) // 10
    kernel = loaded.kernel("mlp")
    np.testing.assert_allclose(kernel(inputs()), reference(inputs(), WIDTHS, 1), rtol=RTOL, atol=ATOL)
    assert len(kernel.native.data) < weight_bytes(WIDTHS)  # the vmfb holds code, not weights


@pytest.mark.parametrize(("executor_min_bytes", "driver"), [("64KiB", "local-task"), ("4MiB", "local-sync")])
def test_the_weights_a_call_reads_count_toward_where_it_runs(mlp_bundle, store, monkeypatch, executor_min_bytes, driver):
    """A call runs on IREE's task executor when its arguments and the kernel's parameters
    together reach `PORTKERN_EXECUTOR_MIN_BYTES` (docs/serving.md): the MLP's argument is 2 KiB,
    its weights about 0.9 MiB."""
    monkeypatch.setenv("PORTKERN_EXECUTOR_MIN_BYTES", executor_min_bytes)
    kernel = portkern.load(mlp_bundle, store=store).kernel("mlp")
    x = inputs()
    assert x.nbytes < 64 << 10 < weight_bytes(WIDTHS) < 4 << 20
    assert [kernel.executable.driver_for([x]) for _ in range(2)] == [driver] * 2
    np.testing.assert_allclose(kernel(x), reference(x, WIDTHS, 1), rtol=RTOL, atol=ATOL)


def test_external_data_model_builds_the_same_section(tmp_path, mlp_bundle, store):
    path = build_mlp(tmp_path / "ext", seed=1, external=True)
    a, b = fmt.read_bundle(path), fmt.read_bundle(mlp_bundle)
    assert a.parameters.root == b.parameters.root and a.kernel("mlp").stage().blob == b.kernel("mlp").stage().blob
    kernel = portkern.load(path, store=store).kernel("mlp")
    np.testing.assert_allclose(kernel(inputs(3)), reference(inputs(3), WIDTHS, 1), rtol=RTOL, atol=ATOL)


def test_same_architecture_other_weights_share_native_code(tmp_path, mlp_bundle, store):
    first = portkern.load(mlp_bundle, store=store)
    other_path = build_mlp(tmp_path / "other", seed=7, name="other")
    other = portkern.load(other_path, store=store)
    assert first.bundle.parameters.root != other.bundle.parameters.root
    a, b = first.kernel("mlp"), other.kernel("mlp")
    assert a.native.key == b.native.key and b.origin == "cache"
    np.testing.assert_allclose(b(inputs()), reference(inputs(), WIDTHS, 7), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(a(inputs()), reference(inputs(), WIDTHS, 1), rtol=RTOL, atol=ATOL)


def copy_of(path: Path, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    target = where / path.name
    target.write_bytes(path.read_bytes())
    return target


@pytest.mark.parametrize("at", ["first", "last"])
def test_a_corrupted_chunk_fails_at_first_use_and_nothing_is_cached(tmp_path, mlp_bundle, store, at):
    path = copy_of(mlp_bundle, tmp_path / at)
    section = fmt.read_bundle(path).parameters
    data = bytearray(path.read_bytes())
    data[section.offset if at == "first" else section.end - 1] ^= 0x40
    path.write_bytes(bytes(data))
    loaded = portkern.load(path, store=store)  # the header, payload and layout are sound
    with pytest.raises(DigestMismatchError, match=r"kernel 'mlp': parameter chunk 0 .* does not match its digest"):
        loaded.kernel("mlp")
    assert list(store.records(mapped.RECORD_KIND)) == []  # nothing remembered as checked
    assert store.entries() == []  # nothing compiled or cached from it
    with pytest.raises(DigestMismatchError):
        portkern.load(path, store=store).kernel("mlp")  # and it fails again, every time


def test_a_truncated_section_is_refused_at_load(tmp_path, mlp_bundle, store):
    path = copy_of(mlp_bundle, tmp_path / "t")
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)
    with pytest.raises(BundleTruncatedError, match="parameter section ends at byte"):
        portkern.load(path, store=store)


def test_bytes_after_the_section_are_refused(tmp_path, mlp_bundle, store):
    path = copy_of(mlp_bundle, tmp_path / "t")
    with open(path, "ab") as f:
        f.write(b"\0")
    with pytest.raises(MalformedBundleError, match="1 unexpected bytes after the parameter section"):
        portkern.load(path, store=store)


def test_checked_chunks_are_remembered_per_file_identity(tmp_path, mlp_bundle, store, monkeypatch):
    path = copy_of(mlp_bundle, tmp_path / "m")
    portkern.load(path, store=store).kernel("mlp")
    hashed = []
    monkeypatch.setattr(mapped, "verify_chunks", lambda f, section, indices, where="": hashed.append(list(indices)))
    kernel = portkern.load(path, store=store).kernel("mlp")  # warm: nothing hashed
    assert hashed == [] and kernel.origin == "cache"
    np.testing.assert_allclose(kernel(inputs()), reference(inputs(), WIDTHS, 1), rtol=RTOL, atol=ATOL)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # another file identity
    portkern.load(path, store=store).kernel("mlp")
    assert hashed == [[0]]


def test_a_file_modified_after_its_check_is_checked_again(tmp_path, mlp_bundle, store):
    path = copy_of(mlp_bundle, tmp_path / "m")
    portkern.load(path, store=store).kernel("mlp")
    section = fmt.read_bundle(path).parameters
    with open(path, "r+b") as f:
        f.seek(section.offset + 8)
        byte = f.read(1)
        f.seek(section.offset + 8)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(DigestMismatchError):
        portkern.load(path, store=store).kernel("mlp")


def rewritten(path: Path, where: Path, change) -> Path:
    """The bundle with its metadata changed by `change(meta)`, digest recomputed, section kept."""
    data = path.read_bytes()
    (_, _, document, end) = framing.unpack_prefix(fmt.file_format(), data)
    change(document["meta"])
    head = framing.pack(fmt.file_format(), document)
    section = fmt.read_bundle(path).parameters
    out = where / "changed.pkb"
    gap = max(0, section.offset - len(head))
    out.write_bytes(head + bytes(gap) + data[section.offset :])
    return out


@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda m: m["kernels"][0]["parameters"][0].update(offset=m["parameters"]["size"]), MalformedBundleError, "is not an aligned range"),
        (lambda m: m["kernels"][0]["parameters"][1].update(offset=m["kernels"][0]["parameters"][1]["offset"] + 1), MalformedBundleError, "is not an aligned range"),
        (lambda m: m["parameters"].update(chunks=m["parameters"]["chunks"] * 2), MalformedBundleError, "needs 1 chunk digests, has 2"),
        (lambda m: m["parameters"].update(root="0" * 64), DigestMismatchError, "do not hash to their root"),
        (lambda m: m["parameters"].update(offset=m["parameters"]["offset"] + 4096), MalformedBundleError, "parameter section starts at"),
        (lambda m: m["kernels"][0]["parameters"].append(m["kernels"][0]["parameters"][0]), MalformedBundleError, "names parameter model::W0 twice"),
        (lambda m: m.pop("parameters"), MalformedBundleError, "no parameter section"),
    ],
)
def test_a_section_whose_layout_does_not_fit_is_refused(tmp_path, mlp_bundle, store, change, error, match):
    with pytest.raises(error, match=match):
        portkern.load(rewritten(mlp_bundle, tmp_path, change), store=store)


def test_a_1_0_header_cannot_carry_parameters(tmp_path, mlp_bundle):
    data = bytearray(mlp_bundle.read_bytes())
    data[10:12] = (0).to_bytes(2, "big")
    path = tmp_path / "old.pkb"
    path.write_bytes(bytes(data))
    with pytest.raises(MalformedBundleError, match="a parameter section needs format 1.1"):
        fmt.read_bundle(path)


def test_the_chunk_root_covers_every_chunk():
    from portkern.portable.parameters import ParameterSection, root_of

    chunks = (hashlib.sha256(b"a").hexdigest(), hashlib.sha256(b"b").hexdigest())
    section = ParameterSection(4096, CHUNK_BYTES + 10, CHUNK_BYTES, chunks, root_of(chunks))
    assert root_of(chunks[::-1]) != section.root
    from portkern.portable.parameters import Parameter

    assert section.chunks_of([Parameter("model", "w", CHUNK_BYTES - 64, 128)]) == [0, 1]
    assert section.chunks_of([Parameter("model", "w", 0, 64), Parameter("model", "v", CHUNK_BYTES, 10)]) == [0, 1]
    assert section.chunk_span(1) == (4096 + CHUNK_BYTES, 10)


def test_tuning_compiles_candidates_without_weights_and_runs_them_with(mlp_bundle, store):
    loaded = portkern.load(mlp_bundle, store=store)
    kernel = loaded.kernel("mlp", tune="quick")
    np.testing.assert_allclose(kernel(inputs(5)), reference(inputs(5), WIDTHS, 1), rtol=RTOL, atol=ATOL)
    assert kernel.tuning is not None
    assert max(entry.size for entry in store.entries()) < weight_bytes(WIDTHS)
