# Writes the fuzz targets' seed corpus (tests/fuzz/corpus/<target>/): small valid files and edge cases.
#   ~/.cache/runner/venv/bin/python tests/fuzz/make_seed_corpus.py [OUT_DIR]
# The output is deterministic; the checked-in files are what "fuzz: replay <target>" and scripts/fuzz read.
import io
import json
import shutil
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save as save_safetensors

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "corpus"
rng = np.random.default_rng(0)


def write(target, name, data):
    path = OUT / target / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(data))


# ---- safetensors --------------------------------------------------------------------------------------------

def safetensors_file(header, data=b""):
    text = header if isinstance(header, (bytes, str)) else json.dumps(header, separators=(",", ":"))
    text = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(text)) + text + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def safetensors_seeds():
    t = "safetensors"
    write(t, "valid-f32", save_safetensors({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}))
    write(t, "valid-dtypes", save_safetensors({
        "f64": torch.tensor([1.5, -2.0], dtype=torch.float64),
        "f16": torch.tensor([0.5, 1.0, 2.0], dtype=torch.float16),
        "bf16": torch.tensor([3.0], dtype=torch.bfloat16),
        "i64": torch.tensor([[1, -2]], dtype=torch.int64),
        "i32": torch.tensor([7], dtype=torch.int32),
        "i16": torch.tensor([-3, 4], dtype=torch.int16),
        "i8": torch.tensor([-1], dtype=torch.int8),
        "u8": torch.tensor([255, 0], dtype=torch.uint8),
        "bool": torch.tensor([True, False]),
        "f8e4m3": torch.zeros(2, dtype=torch.float8_e4m3fn),
        "f8e5m2": torch.zeros(1, dtype=torch.float8_e5m2),
    }, metadata={"format": "pt", "step": "12"}))
    write(t, "valid-scalar-and-empty", save_safetensors({"scalar": torch.tensor(2.0), "empty": torch.zeros(0, 3)}))
    write(t, "valid-no-tensors", safetensors_file({}))
    write(t, "valid-metadata-only", safetensors_file({"__metadata__": {"a": "b"}}))
    write(t, "valid-padded-header", safetensors_file('{"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}    ', b"\x01\x02"))

    good = bytes(save_safetensors({"w": torch.ones(4)}))
    write(t, "truncated-data", good[:-1])
    write(t, "truncated-header", good[:20])
    write(t, "empty-file", b"")
    write(t, "seven-bytes", b"\x02\x00\x00\x00\x00\x00\x00")
    write(t, "header-length-past-end", struct.pack("<Q", 100) + b"{}")
    write(t, "header-length-huge", struct.pack("<Q", 2**63 + 5) + b"{}")
    write(t, "zip-magic", b"PK\x03\x04" + bytes(30))
    write(t, "pickle-magic", b"\x80\x02\x8a\x0a" + bytes(30))
    write(t, "not-json", safetensors_file("{not json"))
    write(t, "not-object", safetensors_file("[1, 2]"))
    write(t, "nul-in-header", safetensors_file(b'{"a":1}\x00garbage'))
    write(t, "byte-order-mark", safetensors_file(b"\xef\xbb\xbf{}"))
    write(t, "number-out-of-range", safetensors_file('{"x":{"dtype":"U8","shape":[1e400],"data_offsets":[0,1]}}', b"\0"))
    write(t, "deep-nesting", safetensors_file('{"__metadata__":' + "[" * 200 + "]" * 200 + "}"))
    write(t, "duplicate-key", safetensors_file('{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                               '"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0"))
    write(t, "metadata-not-object", safetensors_file({"__metadata__": [1]}))
    write(t, "metadata-value-not-string", safetensors_file({"__metadata__": {"a": 1}}))
    write(t, "empty-name", safetensors_file({"": entry("U8", [1], 0, 1)}, b"\0"))
    write(t, "entry-not-object", safetensors_file({"x": 3}))
    write(t, "unexpected-field", safetensors_file({"x": {**entry("U8", [1], 0, 1), "extra": 1}}, b"\0"))
    write(t, "missing-field", safetensors_file({"x": {"dtype": "U8", "shape": [1]}}, b"\0"))
    write(t, "dtype-not-string", safetensors_file({"x": entry(4, [1], 0, 4)}, bytes(4)))
    write(t, "dtype-unknown", safetensors_file({"x": entry("F128", [1], 0, 16)}, bytes(16)))
    write(t, "shape-negative", safetensors_file({"x": entry("U8", [-1], 0, 1)}, b"\0"))
    write(t, "shape-fraction", safetensors_file({"x": entry("U8", [1.5], 0, 1)}, b"\0"))
    write(t, "offsets-three", safetensors_file({"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}}, b"\0\0"))
    write(t, "offsets-reversed", safetensors_file({"x": entry("U8", [0], 1, 0)}, b"\0"))
    write(t, "offsets-past-data", safetensors_file({"x": entry("U8", [4], 0, 4)}, b"\0\0"))
    write(t, "offsets-wrong-size", safetensors_file({"x": entry("F32", [2], 0, 4)}, bytes(4)))
    write(t, "shape-overflow", safetensors_file({"x": entry("F32", [2**32, 2**32, 2], 0, 0)}))
    write(t, "shape-zero-huge-strides", safetensors_file({"x": entry("U8", [0, 2**62, 2**62], 0, 0)}))
    write(t, "offsets-gap", safetensors_file({"a": entry("U8", [1], 0, 1), "b": entry("U8", [1], 2, 3)}, bytes(3)))
    write(t, "offsets-overlap", safetensors_file({"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 1, 3)}, bytes(3)))
    write(t, "data-uncovered-tail", safetensors_file({"a": entry("U8", [1], 0, 1)}, bytes(3)))
    write(t, "bool-byte-2", safetensors_file({"b": entry("BOOL", [3], 0, 3)}, b"\x00\x01\x02"))


# ---- .npy header ---------------------------------------------------------------------------------------------

def npy_bytes(array, **kwargs):
    buffer = io.BytesIO()
    np.save(buffer, array, **kwargs)
    return buffer.getvalue()


def npy_file(header_text, data=b"", version=1):
    text = header_text.encode() if isinstance(header_text, str) else header_text
    if version == 1:
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + data
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<I", len(text)) + text + data


def npy_dict(descr="'<f4'", fortran="False", shape="(2,)"):
    return "{'descr': %s, 'fortran_order': %s, 'shape': %s, }\n" % (descr, fortran, shape)


def npy_seeds():
    t = "npy_header"
    for dtype in ["<f4", "<f8", "<f2", "|u1", "|i1", "<i2", "<i4", "<i8", "<u2", "<u4", "<u8", "|b1", "<c8", "<c16"]:
        name = dtype.replace("<", "").replace("|", "")
        write(t, f"valid-{name}", npy_bytes(np.zeros((2, 3), dtype=np.dtype(dtype))))
    write(t, "valid-scalar", npy_bytes(np.float32(1.5)))
    write(t, "valid-empty-rows", npy_bytes(np.zeros((0, 4), dtype=np.uint8)))
    write(t, "valid-4d-latents", npy_bytes(rng.standard_normal((1, 2, 4, 2, 2)).astype(np.float32)))
    write(t, "valid-fortran-1d", npy_bytes(np.asfortranarray(np.arange(3, dtype=np.int32))))
    write(t, "valid-version-2", npy_file(npy_dict(), bytes(8), version=2))
    write(t, "valid-version-3", npy_file(npy_dict(), bytes(8), version=3))
    write(t, "valid-double-quotes", npy_file('{"descr": "<f4", "fortran_order": False, "shape": (2,)}', bytes(8)))
    write(t, "valid-long-suffix", npy_file(npy_dict(shape="(2L, 1L)"), bytes(8)))
    write(t, "shape-zero-and-huge", npy_file(npy_dict(shape="(0, 9223372036854775807)")))

    good = npy_bytes(np.arange(6, dtype=np.float32))
    write(t, "truncated-data", good[:-2])
    write(t, "truncated-header", good[:40])
    write(t, "extra-data", good + b"\0")
    write(t, "empty-file", b"")
    write(t, "bad-magic", b"\x93NUMPX\x01\x00" + good[8:])
    write(t, "version-4", b"\x93NUMPY\x04\x00" + good[8:])
    write(t, "version-2-short", b"\x93NUMPY\x02\x00\x10\x00")
    write(t, "header-length-past-end", b"\x93NUMPY\x01\x00\xff\xff{}")
    write(t, "header-length-huge", b"\x93NUMPY\x02\x00\xff\xff\xff\xff{}")
    write(t, "big-endian", npy_file(npy_dict(descr="'>f4'"), bytes(8)))
    write(t, "big-endian-byte", npy_file(npy_dict(descr="'>u1'"), bytes(2)))
    write(t, "structured-dtype", npy_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", bytes(4)))
    write(t, "object-dtype", npy_file(npy_dict(descr="'|O'"), bytes(16)))
    write(t, "short-descr", npy_file(npy_dict(descr="'f'"), bytes(8)))
    write(t, "fortran-2d", npy_file(npy_dict(fortran="True", shape="(2, 2)"), bytes(16)))
    write(t, "fortran-not-bool", npy_file(npy_dict(fortran="1"), bytes(8)))
    write(t, "shape-negative", npy_file(npy_dict(shape="(-1,)"), bytes(4)))
    write(t, "shape-not-tuple", npy_file(npy_dict(shape="[2]"), bytes(8)))
    write(t, "shape-missing-paren", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,"))
    write(t, "shape-digits-overflow", npy_file(npy_dict(shape="(99999999999999999999,)")))
    write(t, "shape-product-overflow", npy_file(npy_dict(shape="(4294967296, 4294967296)")))
    write(t, "shape-33-dims", npy_file(npy_dict(shape="(" + "1, " * 33 + ")"), bytes(4)))
    write(t, "unknown-key", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", bytes(8)))
    write(t, "missing-key", npy_file("{'descr': '<f4', 'shape': (2,)}", bytes(8)))
    write(t, "unterminated-string", npy_file("{'descr: '<f4"))
    write(t, "text-after-dict", npy_file(npy_dict() + "x", bytes(8)))
    write(t, "no-closing-brace", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,) "))


# ---- IDX (MNIST) ---------------------------------------------------------------------------------------------

def idx_file(type_code, shape, data=None, element=1):
    header = bytes([0, 0, type_code, len(shape)]) + b"".join(struct.pack(">I", d) for d in shape)
    if data is None:
        count = int(np.prod(shape)) if shape else 0
        data = bytes(count * element)
    return header + data


def idx_seeds():
    t = "idx"
    write(t, "valid-images-ubyte", idx_file(0x08, [2, 4, 4], rng.integers(0, 256, 32, dtype=np.uint8).tobytes()))
    write(t, "valid-labels-ubyte", idx_file(0x08, [3], bytes([0, 9, 5])))
    write(t, "valid-byte", idx_file(0x09, [2]))
    write(t, "valid-short", idx_file(0x0B, [2, 1], element=2))
    write(t, "valid-int", idx_file(0x0C, [1], element=4))
    write(t, "valid-float", idx_file(0x0D, [2], element=4))
    write(t, "valid-double", idx_file(0x0E, [1, 1, 1], element=8))
    write(t, "valid-zero-rows", idx_file(0x08, [0, 28, 28]))
    write(t, "valid-zero-and-huge", idx_file(0x08, [0, 0x7FFFFFFF, 0x7FFFFFFF], b""))
    write(t, "valid-8-dims", idx_file(0x08, [1] * 8))
    write(t, "bad-magic", b"\x01\x00\x08\x01\x00\x00\x00\x01\x00")
    write(t, "unknown-type", idx_file(0x0A, [1], b"\0"))
    write(t, "zero-dims", b"\x00\x00\x08\x00")
    write(t, "nine-dims", idx_file(0x08, [1] * 9))
    write(t, "header-truncated", b"\x00\x00\x08\x03\x00\x00\x00\x02\x00")
    write(t, "data-truncated", idx_file(0x08, [2, 4, 4])[:-1])
    write(t, "data-extra", idx_file(0x08, [2]) + b"\0")
    write(t, "dim-too-large", idx_file(0x08, [0x80000000], b""))
    write(t, "shape-wraps", idx_file(0x0E, [0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF], b""))
    write(t, "three-bytes", b"\x00\x00\x08")
    write(t, "empty-file", b"")


# ---- CIFAR-10 binary batches ----------------------------------------------------------------------------------

def cifar_seeds():
    t = "cifar"
    record = lambda label: bytes([label]) + rng.integers(0, 256, 3072, dtype=np.uint8).tobytes()
    write(t, "valid-one-record", record(3))
    write(t, "valid-two-records", record(0) + record(9))
    write(t, "label-10", record(10))
    write(t, "second-label-255", record(1) + record(255))
    write(t, "one-byte-short", record(2)[:-1])
    write(t, "one-byte-extra", record(2) + b"\0")
    write(t, "cifar-100-record", bytes([1, 42]) + bytes(3072))
    write(t, "empty-file", b"")
    write(t, "one-byte", b"\x05")


# ---- JPEG and PNG decoding -----------------------------------------------------------------------------------
# image_decode_fuzz reads its knobs from the last 4 bytes of an input: [flags, min_shorter_side, top, left].
# flags & 1: DCT downscaling to min_shorter_side; flags & 2: a window from (top, left), its height divided by
# 1 + (flags >> 4) and its width by 1 + (flags >> 6).
PLAIN = bytes([0, 0, 0, 0])
KNOBS = {
    "plain": PLAIN,
    "scaled": bytes([1, 3, 0, 0]),
    "window": bytes([0x12, 0, 5, 9]),
    "scaled-window": bytes([0x53, 4, 1, 2]),
}


def gradient(width, height, mode):
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x ^ y) * 37 % 256], -1)
    image = Image.fromarray(rgb.astype(np.uint8), "RGB")
    return image.convert(mode) if mode != "RGB" else image


def jpeg(image, **kwargs):
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", **kwargs)
    return buffer.getvalue()


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_raw(width, height, color_type, bit_depth, samples, interlace=False, extra_chunks=()):
    """A PNG from an array [height, width, channels] of samples, filter 0, optionally Adam7-interlaced."""
    def scanlines(rows):
        out = b""
        for row in rows:
            flat = row.reshape(-1)
            if bit_depth == 16:
                out += b"\0" + flat.astype(">u2").tobytes()
            elif bit_depth == 8:
                out += b"\0" + flat.astype(np.uint8).tobytes()
            else:
                out += b"\0" + np.packbits(np.unpackbits(flat.astype(np.uint8)[:, None], axis=1)[:, 8 - bit_depth:]).tobytes()
        return out

    if interlace:
        passes = [(0, 0, 8, 8), (0, 4, 8, 8), (4, 0, 8, 4), (0, 2, 4, 4), (2, 0, 4, 2), (0, 1, 2, 2), (1, 0, 2, 1)]
        raw = b""
        for y0, x0, dy, dx in passes:
            sub = samples[y0::dy, x0::dx]
            if sub.shape[0] and sub.shape[1]:
                raw += scanlines(sub)
    else:
        raw = scanlines(samples)
    header = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 1 if interlace else 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + b"".join(extra_chunks) +
            png_chunk(b"IDAT", zlib.compress(raw, 9)) + png_chunk(b"IEND", b""))


def png(image, **kwargs):
    buffer = io.BytesIO()
    image.save(buffer, "PNG", **kwargs)
    return buffer.getvalue()


def image_seeds():
    t = "image_decode"
    rgb = gradient(40, 24, "RGB")
    jpegs = {
        "jpeg-rgb-420": jpeg(rgb, quality=75),
        "jpeg-rgb-444": jpeg(rgb, quality=90, subsampling=0),
        "jpeg-gray": jpeg(gradient(17, 9, "L")),
        "jpeg-progressive": jpeg(rgb, progressive=True),
        "jpeg-1x1": jpeg(gradient(1, 1, "RGB")),
        "jpeg-tall-70x8": jpeg(gradient(8, 70, "RGB")),
    }
    for name, data in jpegs.items():
        for knob_name, knobs in KNOBS.items():
            write(t, f"{name}-{knob_name}", data + knobs)
    write(t, "jpeg-cmyk", jpeg(gradient(8, 8, "CMYK")) + PLAIN)
    good = jpegs["jpeg-rgb-420"]
    write(t, "jpeg-truncated", good[: len(good) // 2] + PLAIN)
    write(t, "jpeg-no-eoi", good[:-2] + PLAIN)
    corrupt = bytearray(good)
    scan = good.index(b"\xff\xda")
    for i in range(scan + 20, len(corrupt) - 4, 7):
        corrupt[i] ^= 0x5A
    write(t, "jpeg-corrupt-entropy", bytes(corrupt) + PLAIN)
    write(t, "jpeg-soi-only", b"\xff\xd8\xff" + PLAIN)

    pngs = {
        "png-rgb": png(rgb),
        "png-rgba": png(gradient(9, 5, "RGBA")),
        "png-gray": png(gradient(7, 3, "L")),
        "png-gray-alpha": png(gradient(5, 5, "LA")),
        "png-palette": png(gradient(6, 6, "P")),
        "png-palette-transparency": png(gradient(6, 6, "P"), transparency=0),
        "png-1bit": png(gradient(11, 3, "1")),
    }
    samples = rng.integers(0, 65536, (5, 6, 3))
    pngs["png-rgb16"] = png_raw(6, 5, 2, 16, samples)
    pngs["png-gray16"] = png_raw(4, 3, 0, 16, samples[:3, :4, :1])
    pngs["png-rgb-interlaced"] = png_raw(10, 9, 2, 8, rng.integers(0, 256, (9, 10, 3)), interlace=True)
    pngs["png-gray2-interlaced"] = png_raw(5, 3, 0, 2, rng.integers(0, 4, (3, 5, 1)), interlace=True)
    pngs["png-gray-trns"] = png_raw(4, 2, 0, 8, rng.integers(0, 256, (2, 4, 1)),
                                    extra_chunks=[png_chunk(b"tRNS", b"\x00\x10")])
    for name, data in pngs.items():
        write(t, f"{name}-plain", data + PLAIN)
    write(t, "png-rgb-window", pngs["png-rgb"] + KNOBS["window"])
    good = pngs["png-rgb"]
    write(t, "png-truncated", good[: len(good) // 2] + PLAIN)
    write(t, "png-no-iend", good[:-12] + PLAIN)
    bad_crc = bytearray(good)
    bad_crc[29] ^= 1  # the IHDR CRC
    write(t, "png-bad-ihdr-crc", bytes(bad_crc) + PLAIN)
    huge = struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0)
    write(t, "png-huge-dimensions", b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", huge) + good[33:] + PLAIN)
    write(t, "png-signature-only", b"\x89PNG\r\n\x1a\n" + PLAIN)
    write(t, "not-an-image", b"GIF89a\x01\x00\x01\x00" + PLAIN)
    write(t, "empty-after-knobs", PLAIN)


if __name__ == "__main__":
    if OUT.exists():
        shutil.rmtree(OUT)
    safetensors_seeds()
    npy_seeds()
    idx_seeds()
    cifar_seeds()
    image_seeds()
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"{sum(1 for p in OUT.rglob('*') if p.is_file())} files, {total} bytes in {OUT}")
