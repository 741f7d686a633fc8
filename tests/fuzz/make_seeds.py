#!/usr/bin/env python3
"""make_seeds.py — writes the seed corpora under tests/fuzz/corpus/ from the plan
golden cases and from small llm.c files built here (what each target reads:
tests/fuzz/README.md). Run from the repository root; it replaces the seeds."""
import hashlib
import hmac
import os
import shutil
import struct

ROOT = "tests/fuzz/corpus"
PLANS = "tests/plans"
SEPARATOR = "\n--set\n"  # fuzz_plan: plan text, then one override per line


def out_dir(target):
    d = os.path.join(ROOT, target)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def plan_seed(case_dir):
    text = open(os.path.join(case_dir, "plan.json"), "rb").read()
    # fuzz_plan puts the init fixtures beside the plan
    text = text.replace(b"../../fixtures/", b"")
    ovr = os.path.join(case_dir, "overrides")
    if os.path.exists(ovr):
        lines = [l for l in open(ovr, "rb").read().split(b"\n") if l]
        text = text.rstrip(b"\n") + SEPARATOR.encode() + b"\n".join(lines) + b"\n"
    return text


INVALID_SEEDS = [
    "duplicate_key", "escaped_key_is_the_same_key", "hidden_too_large_to_address",
    "init_bad_magic", "init_contradicts_layers", "init_seq_len_exceeds_max",
    "key_with_control_characters_is_escaped", "long_literal_is_shortened", "nul_byte",
    "override_through_a_non_object", "override_whole_section_unknown_key",
    "parallel_tp_must_divide_padded_vocab", "ranks_product_overflows_int",
    "unknown_nested_key_near_miss", "warmup_not_below_steps_with_cosine",
]


# reals that need all 17 digits, and overrides that need a directory and quoting
EXTRA_PLAN = (r"""{"model": {"layers": 3, "heads": 3, "hidden": 12, "vocab": 50257, "seq_len": 7},
 "data": {"train": "tiny_tokens.bin", "shuffle": true},
 "optimizer": {"lr": 0.30000000000000004, "beta1": 0.8999999999999999, "eps": 4.9e-324,
               "weight_decay": 1.7976931348623157e308, "min_lr_ratio": 0.1234567890123456},
 "steps": 9, "sample": {"temperature": 3.141592653589793, "prompt": "caf\u00e9 \ud83d\ude00"}}"""
              + SEPARATOR + 'sample.prompt="quoted\\u0001"\ncheckpoint.dir=./out/../ckpt\n')


def plan_corpus():
    d = out_dir("fuzz_plan")
    open(os.path.join(d, "extra-many_digit_reals.json"), "w").write(EXTRA_PLAN)
    for kind, cases in (("valid", sorted(os.listdir(os.path.join(PLANS, "valid")))),
                        ("invalid", INVALID_SEEDS)):
        for case in cases:
            seed = plan_seed(os.path.join(PLANS, kind, case))
            open(os.path.join(d, f"{kind}-{case}.json"), "wb").write(seed)


def header(*ints):
    return struct.pack("<256i", *ints, *([0] * (256 - len(ints))))


def shard(tokens):
    return header(20240520, 1, len(tokens)) + struct.pack(f"<{len(tokens)}H", *tokens)


def data_seed(b, t, vocab, shuffle, shards, batches, seed=0, seek=(0, 0, 0), seek_on=False):
    """fuzz_data's input: a 40-byte control block, then the shard files."""
    flags = (1 if shuffle else 0) | (len(shards) - 1) << 1 | (8 if seek_on else 0) | 16
    ctl = struct.pack("<BBHBBH", b - 1, t - 1, vocab - 1, flags, batches, 0)
    ctl += struct.pack("<Q", seed) + struct.pack("<qqq", *seek)
    body = b"".join(struct.pack("<I", len(s)) + s for s in shards[:-1]) + shards[-1]
    return ctl + body


def data_corpus():
    d = out_dir("fuzz_data")
    tiny = open(os.path.join(PLANS, "fixtures", "tiny_tokens.bin"), "rb").read()
    text = [c for c in b"to be, or not to be: that is the question."]
    seeds = {
        "tiny_tokens_in_order": data_seed(1, 2, 8, False, [tiny], 6),
        "tiny_tokens_shuffled": data_seed(1, 3, 8, True, [tiny], 6, seed=7),
        "two_shards_in_order": data_seed(2, 4, 256, False, [shard(text), shard(text[::-1])], 12),
        "three_shards_shuffled_seek": data_seed(2, 3, 256, True,
                                                [shard(text), shard(text[:13]), shard(text[5:])],
                                                16, seed=42, seek=(1, 1, 2), seek_on=True),
        "token_above_vocab": data_seed(1, 4, 100, False, [shard(text)], 8),
        "no_shard_holds_a_window": data_seed(8, 32, 256, False, [tiny], 1),
        "short_file": data_seed(1, 1, 8, False, [tiny[:700]], 1),
        "count_disagrees_with_size": data_seed(1, 1, 8, False, [header(20240520, 1, 9) + tiny[1024:]], 1),
    }
    for name, seed in seeds.items():
        open(os.path.join(d, name), "wb").write(seed)


def gpt2(version, max_t, vocab, padded, layers, heads, hidden, fill=0):
    n = padded * hidden + max_t * hidden + layers * (12 * hidden * hidden + 13 * hidden) + 2 * hidden
    width = 4 if version == 3 else 2
    body = bytes((fill + i) % 251 for i in range(n * width)) if fill else bytes(n * width)
    return header(20240326, version, max_t, vocab, layers, heads, hidden, padded) + body


def tokenizer(version, pieces, eot=None):
    ints = [20240328, version, len(pieces)] + ([eot] if version == 2 else [])
    return header(*ints) + b"".join(bytes([len(p)]) + p for p in pieces)


def llmc_corpus():
    d = out_dir("fuzz_llmc")
    pieces = [bytes([i]) for i in range(8)] + [b"the", b" and", b"<|endoftext|>"]
    seeds = {
        "tiny_gpt2_fp32": open(os.path.join(PLANS, "fixtures", "tiny_gpt2.bin"), "rb").read(),
        "gpt2_bf16_patterned": gpt2(5, 4, 7, 8, 1, 2, 4, fill=3),
        "gpt2_fp32_two_layers": gpt2(3, 2, 5, 6, 2, 1, 2, fill=1),
        "gpt2_bad_version": header(20240326, 4, 4, 8, 1, 2, 4, 8),
        "gpt2_truncated": gpt2(3, 4, 8, 8, 1, 2, 4)[:1500],
        "tokenizer_v1": tokenizer(1, pieces),
        "tokenizer_v2_eot": tokenizer(2, pieces, eot=10),
        "tokenizer_truncated": tokenizer(2, pieces, eot=10)[:1040],
        "token_shard_is_not_a_model": open(os.path.join(PLANS, "fixtures", "tiny_tokens.bin"), "rb").read(),
    }
    for name, seed in seeds.items():
        open(os.path.join(d, name), "wb").write(seed)


# fuzz_sock_handshake: struct control (ranks - 1, acceptor, flags, hello bytes,
# name bytes, secret bytes), the name, the secret, nonce_a, then the hello,
# challenge, proof and ack (sock_connect.h), with MACs made here
HS_SHM, HS_RIGHT_PROOF, HS_RIGHT_CHALLENGE = 1, 2, 4


def hs_mac(secret, label, name, frm, to, kind, nonce_c, nonce_a):
    t = struct.pack("<I", len(name)) + name + struct.pack("<iiI", frm, to, kind)
    t += nonce_c + nonce_a
    return hmac.new(secret, label + t, hashlib.sha256).digest()


def hs_seed(ranks, to, frm, kind, flags=0, hello=None, name=b"world.g0", secret=b"s" * 64,
            good_macs=True, ack=b"PLOK\0\0\0\0"):
    nonce_c, nonce_a = bytes(range(32)), bytes(range(100, 132))
    if hello is None:
        hello = b"PLCM" + struct.pack("<IiiII", 1, frm, to, kind, 0) + nonce_c
    flags |= HS_SHM if kind == 1 else 0
    pair = (name, frm, to, kind, nonce_c, nonce_a)
    challenge = nonce_a + hs_mac(secret, b"plait-comm-v1 acceptor", *pair)
    proof = hs_mac(secret, b"plait-comm-v1 connector", *pair)
    if not good_macs:
        challenge, proof = bytes(64), bytes(32)
    control = struct.pack("<HHBBBB", ranks - 1, to, flags, len(hello), len(name), len(secret))
    return control + name + secret + nonce_a + hello + challenge + proof + ack


def hs_hello(frm, to, kind, reserved=0):
    return b"PLCM" + struct.pack("<IiiII", 1, frm, to, kind, reserved) + bytes(32)


def sock_handshake_corpus():
    d = out_dir("fuzz_sock_handshake")
    seeds = {
        "tcp_hello_challenge_proof_ack": hs_seed(3, 0, 2, 0),
        "shm_hello_right_flags": hs_seed(8, 3, 7, 1, HS_RIGHT_PROOF | HS_RIGHT_CHALLENGE),
        "wrong_macs": hs_seed(2, 0, 1, 0, good_macs=False),
        "hello_to_another_rank": hs_seed(4, 1, 3, 0, hello=hs_hello(3, 2, 0)),
        "hello_from_itself": hs_seed(4, 1, 1, 0),
        "hello_from_a_negative_rank": hs_seed(4, 1, -1, 0),
        "hello_kind_mismatch": hs_seed(2, 0, 1, 1, hello=hs_hello(1, 0, 0)),
        "hello_reserved_not_zero": hs_seed(2, 0, 1, 0, hello=hs_hello(1, 0, 0, 7)),
        "hello_short": hs_seed(2, 0, 1, 0, hello=hs_hello(1, 0, 0)[:55]),
        "garbage": hs_seed(2, 0, 1, 0, hello=bytes((i * 37 + 11) % 256 for i in range(56)),
                           ack=b"PLOK\0\0\0\1"),
        "long_name_and_secret": hs_seed(5, 2, 4, 0, name=b"n" * 64, secret=bytes(range(1, 200))),
    }
    for name, seed in seeds.items():
        open(os.path.join(d, name), "wb").write(seed)


# fuzz_ckpt_parts: the first byte picks one of the 16 part files of the three
# checkpoints the target writes (tests/fuzz/README.md; bit 7: the manifest keeps
# the file's old size and checksum), the rest replaces it. The tiny GPT-2's
# shards: whole 1032 floats; tp 2 × pp 2: stage 0 300, stage 1 292; pp 2 ×
# 2 chunks, ZeRO 1 over dp 2: stage 0 536 (slices of 268), stage 1 528 (264).
def part_header(kind, tp, tp_rank, pp, pp_rank, dp, dp_rank, zero, count, arrays, chunks,
                layers, ranged=True):
    first, last = layers if ranged else (0, 0)
    return header(20261124, 1, kind, tp, tp_rank, pp, pp_rank, dp, dp_rank, zero, count, 0,
                  arrays, chunks if chunks > 1 else 0, 1 if ranged else 0, first, last)


def floats(n, fill):
    return struct.pack(f"<{n}f", *[(fill + i % 23) / 4 for i in range(n)])


def ckpt_parts_corpus():
    d = out_dir("fuzz_ckpt_parts")
    model_0 = part_header(1, 2, 0, 2, 0, 1, 0, 0, 300, 1, 1, (0, 2)) + floats(300, 1)
    last_model = part_header(1, 2, 1, 2, 1, 1, 0, 0, 292, 1, 1, (2, 4))  # tp rank 1, stage 1
    seeds = {
        "model_part_valid": b"\x02" + model_0,
        "model_part_valid_manifest_stale": b"\x82" + model_0,
        "model_part_before_layer_ranges": b"\x02"
        + part_header(1, 2, 0, 2, 0, 1, 0, 0, 300, 1, 1, (0, 2), ranged=False) + floats(300, 2),
        "moments_zero_slice_valid": b"\x0d"
        + part_header(2, 1, 0, 2, 0, 2, 1, 1, 268, 2, 2, (0, 1)) + floats(536, 3),
        "last_stage_model_part_of_tp_rank_1_valid": b"\x05" + last_model + floats(292, 8),
        "moments_zero_slice_of_the_last_stage_valid": b"\x0e"
        + part_header(2, 1, 0, 2, 1, 2, 0, 1, 264, 2, 2, (1, 2)) + floats(528, 9),
        "whole_moments_valid": b"\x01" + header(20261122, 1, 1032, 0, 0) + floats(2064, 4),
        "model_part_truncated": b"\x05" + last_model + floats(100, 5),
        "model_part_layers_of_another_stage": b"\x04"
        + part_header(1, 2, 0, 2, 1, 1, 0, 0, 292, 1, 1, (0, 2)) + floats(292, 6),
        "moments_slice_count_disagrees": b"\x0e"
        + part_header(2, 1, 0, 2, 1, 2, 0, 1, 250, 2, 2, (1, 2)) + floats(500, 7),
    }
    for name, seed in seeds.items():
        open(os.path.join(d, name), "wb").write(seed)


def safetensors_file(tensors, metadata=None):
    """tensors: [(name, dtype, shape, raw bytes)] -> a safetensors file."""
    import json
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def safetensors_corpus():
    d = out_dir("fuzz_safetensors")
    f32 = struct.pack("<6f", 1.0, -2.5, 0.0, 3.25, 1e-30, -7.0)
    seeds = {
        "f32_2x3_with_metadata": safetensors_file(
            [("model.embed_tokens.weight", "F32", [2, 3], f32)], {"format": "pt"}),
        "bf16_and_f16": safetensors_file(
            [("a", "BF16", [4], struct.pack("<4H", 0x3F80, 0xC020, 0x0001, 0x7F80)),
             ("b", "F16", [2, 2], struct.pack("<4H", 0x3C00, 0x8001, 0x7C00, 0x7E00))]),
        "scalar_and_empty": safetensors_file(
            [("s", "F32", [], struct.pack("<f", 2.0)), ("e", "F32", [0, 5], b"")]),
        "i64_unreadable": safetensors_file([("ids", "I64", [2], struct.pack("<2q", 1, 2))]),
        "offset_beyond": struct.pack("<Q", 64) + b'{"t":{"dtype":"F32","shape":[1],'
                                                 b'"data_offsets":[0,400]}}'.ljust(64),
        "overlapping": struct.pack("<Q", 112) + (b'{"a":{"dtype":"F32","shape":[2],'
                                                b'"data_offsets":[0,8]},"b":{"dtype":"F16",'
                                                b'"shape":[2],"data_offsets":[4,8]}}').ljust(112)
        + f32[:8],
    }
    for name, seed in seeds.items():
        open(os.path.join(d, name), "wb").write(seed)


if __name__ == "__main__":
    safetensors_corpus()
    plan_corpus()
    data_corpus()
    llmc_corpus()
    sock_handshake_corpus()
    ckpt_parts_corpus()
