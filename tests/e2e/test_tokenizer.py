"""`ppserve tokenize` / `detokenize` against hand-derived ids and the independent Python reference
(tests/reference/tokenizer_ref.py), for both families and both file formats.

The hand vocabularies are small enough to derive every expected id on paper; the comments next to
each case give the derivation. Random strings then check the C tokenizer against the reference,
the GGUF against the tokenizer.json copy of the same tokenizer, and decode(encode(s)) == s.

Round trip for SentencePiece: encoding prepends one ▁ (the dummy prefix) to the text; decoding
drops exactly one leading space, so decode(encode(s)) == s for every s, including s that starts
with spaces. The exceptions are inherent in the format: a literal U+2581 in the text is the
space marker itself and comes back as a space, and special-token text comes back as nothing."""
import json
import random
import struct
import subprocess
import sys

import pytest

from conftest import PPSERVE, ROOT, run

sys.path.insert(0, str(ROOT / "tests" / "reference"))
try:
    import tokenizer_ref  # needs python3-regex
except ImportError:  # pragma: no cover
    tokenizer_ref = None

pytestmark = pytest.mark.skipif(tokenizer_ref is None, reason="python3-regex is not installed")

M = "\u2581"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


# ---- writing hand-made tokenizers -------------------------------------------------------------

def gguf_bytes(kv):
    """A GGUF v3 file with metadata kv (list of (key, type, value)) and no tensors."""
    def s(x):
        b = x.encode("utf-8", "surrogateescape") if isinstance(x, str) else x
        return struct.pack("<Q", len(b)) + b
    out = struct.pack("<IIQQ", 0x46554747, 3, 0, len(kv))
    for key, ty, val in kv:
        out += s(key)
        if ty == "str":
            out += struct.pack("<I", 8) + s(val)
        elif ty == "u32":
            out += struct.pack("<II", 4, val)
        elif ty == "bool":
            out += struct.pack("<IB", 7, int(val))
        elif ty == "strs":
            out += struct.pack("<IIQ", 9, 8, len(val)) + b"".join(s(v) for v in val)
        elif ty == "f32s":
            out += struct.pack("<IIQ", 9, 6, len(val)) + struct.pack(f"<{len(val)}f", *val)
        elif ty == "i32s":
            out += struct.pack("<IIQ", 9, 5, len(val)) + struct.pack(f"<{len(val)}i", *val)
    return out


def byte_char(b):
    return tokenizer_ref.BYTE_TO_CHAR[b]


# SentencePiece-style: <unk> <s> </s>, 256 byte tokens, then characters and merged pieces.
SPM_EXTRA = [  # (piece, score, type)
    (M, -100.0, 1), ("a", -101.0, 1), ("b", -102.0, 1), ("c", -103.0, 1), ("日", -104.0, 1),
    (M + "a", -1.0, 1), ("ab", -2.0, 1), ("bc", -3.0, 1), (M + "ab", -4.0, 1), (M + M, -5.0, 1),
    (M + "abc", -6.0, 1), ("<tag>", 0.0, 4),
]
SPM_IDS = {p: 259 + i for i, (p, _, _) in enumerate(SPM_EXTRA)}


def spm_vocab():
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    scores = [0.0] * len(toks)
    types = [2, 3, 3] + [6] * 256
    for p, sc, ty in SPM_EXTRA:
        toks.append(p)
        scores.append(sc)
        types.append(ty)
    return toks, scores, types


def write_spm(folder):
    toks, scores, types = spm_vocab()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tok.gguf").write_bytes(gguf_bytes([
        ("tokenizer.ggml.model", "str", "llama"), ("tokenizer.ggml.tokens", "strs", toks),
        ("tokenizer.ggml.scores", "f32s", scores), ("tokenizer.ggml.token_type", "i32s", types),
        ("tokenizer.ggml.bos_token_id", "u32", 1), ("tokenizer.ggml.eos_token_id", "u32", 2),
        ("tokenizer.ggml.unknown_token_id", "u32", 0)]))
    # the same tokenizer as HF writes it: every split of a piece into two tokens is a merge,
    # ranked by the score of the piece (SentencePiece's order)
    merges = []
    for p, sc, ty in sorted(SPM_EXTRA, key=lambda e: -e[1]):
        if ty != 1 or len(p) < 2:
            continue
        for k in range(1, len(p)):
            if p[:k] in SPM_IDS and p[k:] in SPM_IDS:
                merges.append(f"{p[:k]} {p[k:]}")
    hf = folder / "hf"
    hf.mkdir(exist_ok=True)
    added = [{"id": i, "content": toks[i], "special": types[i] != 4}
             for i in range(len(toks)) if types[i] in (2, 3, 4)]
    (hf / "tokenizer.json").write_text(json.dumps({
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": M},
            {"type": "Replace", "pattern": {"String": " "}, "content": M}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": M}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "byte_fallback": True, "unk_token": "<unk>",
                  "vocab": {t: i for i, t in enumerate(toks) if types[i] != 4},
                  "merges": merges}}, ensure_ascii=False))
    (hf / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return folder / "tok.gguf", hf


# byte-level BPE: the 256 byte characters, then merged pieces, then the specials
BPE_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("1", "2"), ("12", "3"), ("Ċ", "Ċ"),
              ("Ġ", "Ġ"), ("æ", "Ĺ"), ("æĹ", "¥")]
# 256 Ġt, 257 he, 258 Ġthe, 259 12, 260 123, 261 ĊĊ, 262 ĠĠ, 263 æĹ, 264 æĹ¥ (日),
# 265 Ġhe (no merge makes it: reachable only whole, with ignore_merges), 266/267 specials
BOS, EOS = 266, 267


def bpe_vocab():
    toks = [byte_char(b) for b in range(256)] + [a + b for a, b in BPE_MERGES] + ["Ġhe"]
    types = [1] * len(toks)
    toks += ["<|begin_of_text|>", "<|end_of_text|>"]
    types += [3, 3]
    return toks, types


def write_bpe(folder, pre="llama-bpe"):
    toks, types = bpe_vocab()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tok.gguf").write_bytes(gguf_bytes([
        ("tokenizer.ggml.model", "str", "gpt2"), ("tokenizer.ggml.pre", "str", pre),
        ("tokenizer.ggml.tokens", "strs", toks), ("tokenizer.ggml.token_type", "i32s", types),
        ("tokenizer.ggml.merges", "strs", [f"{a} {b}" for a, b in BPE_MERGES]),
        ("tokenizer.ggml.bos_token_id", "u32", BOS), ("tokenizer.ggml.eos_token_id", "u32", EOS),
        ("tokenizer.ggml.add_bos_token", "bool", True)]))
    hf = folder / "hf"
    hf.mkdir(exist_ok=True)
    regex = LLAMA3 if pre == "llama-bpe" else LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
    (hf / "tokenizer.json").write_text(json.dumps({
        "added_tokens": [{"id": BOS, "content": toks[BOS], "special": True},
                         {"id": EOS, "content": toks[EOS], "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": toks[BOS], "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {toks[BOS]: {"id": toks[BOS], "ids": [BOS],
                                                          "tokens": [toks[BOS]]}}},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "byte_fallback": False, "ignore_merges": pre == "llama-bpe",
                  "vocab": {t: i for i, t in enumerate(toks[:BOS])},
                  "merges": [[a, b] for a, b in BPE_MERGES]}}, ensure_ascii=False))
    (hf / "config.json").write_text(json.dumps({"bos_token_id": BOS, "eos_token_id": EOS}))
    return folder / "tok.gguf", hf


# ---- driving ppserve and the reference --------------------------------------------------------

def tokenize(model, data, tmp_path, extra=()):
    f = tmp_path / "text.bin"
    f.write_bytes(data)
    p = run([PPSERVE, "tokenize", "--model", str(model), "--json", "--file", str(f), *extra])
    return json.loads(p.stdout)["ids"]


def detok_bytes(model, ids, tmp_path):
    """Raw bytes of detokenize (stdout read as bytes, not text)."""
    p = subprocess.run([PPSERVE, "detokenize", "--model", str(model), ",".join(map(str, ids))],
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.endswith(b"\n")
    return p.stdout[:-1]


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    return write_spm(tmp_path_factory.mktemp("spm"))


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return write_bpe(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return write_bpe(tmp_path_factory.mktemp("qwen"), pre="qwen2")


def b(i):  # the SentencePiece byte token of byte i
    return 3 + i


I = SPM_IDS
SPM_CASES = [
    # "▁ab": ▁a (-1) merges first, then ▁a+b = ▁ab (-4)
    ("ab", [1, I[M + "ab"]]),
    # ▁,a,b,c: ▁a; then bc (-3) beats ▁ab (-4); then ▁a+bc = ▁abc
    ("abc", [1, I[M + "abc"]]),
    # "▁▁a": ▁a (-1) beats ▁▁ (-5); ▁+▁a is no token
    (" a", [1, I[M], I[M + "a"]]),
    ("a日c", [1, I[M + "a"], I["日"], I["c"]]),
    # € (E2 82 AC) is no token: byte fallback
    ("a€", [1, I[M + "a"], b(0xE2), b(0x82), b(0xAC)]),
    ("ab\n", [1, I[M + "ab"], b(0x0A)]),
    (b"\xff", [1, I[M], b(0xFF)]),
    # special/added tokens split the text first; each text segment gets the dummy prefix
    ("a<tag>b", [1, I[M + "a"], I["<tag>"], I[M], I["b"]]),
    ("<s>ab", [1, 1, I[M + "ab"]]),
    ("", [1]),
    ("a  b", [1, I[M + "a"], I[M + M], I["b"]]),
]

BPE_CASES = [
    ("the", [BOS, ord("t"), 257]),                       # t,h,e: he; no merge t+he
    (" the", [BOS, 258]),                                # Ġt (rank 0), he (1), Ġthe (2)
    ("12345", [BOS, 260, ord("4"), ord("5")]),           # \p{N}{1,3}: "123" "45"
    ("a\n\nb", [BOS, ord("a"), 261, ord("b")]),          # \s*[\r\n]+ takes "\n\n"
    ("a   b", [BOS, ord("a"), 262, 32, ord("b")]),       # "  " (\s+(?!\S)), " b"
    ("日本", [BOS, 264, 0xE6, 0x9C, 0xAC]),              # æĹ¥ = 日; 本 stays bytes
    ("🎉", [BOS, 0xF0, 0x9F, 0x8E, 0x89]),
    ("x<|end_of_text|>y", [BOS, ord("x"), EOS, ord("y")]),
    (b"\xff\xfe", [BOS, 0xFF, 0xFE]),                    # invalid UTF-8: one gap piece
    ("don't", [BOS, ord("d"), ord("o"), ord("n"), ord("'"), ord("t")]),
    (" he", [BOS, 265]),                                 # ignore_merges: Ġhe is a token
    ("", [BOS]),
]

QWEN_CASES = [
    ("12345", [BOS, ord("1"), ord("2"), ord("3"), ord("4"), ord("5")]),  # \p{N}: one digit each
    (" he", [BOS, 32, 257]),                             # no ignore_merges: Ġ + he
]


def as_bytes(s):
    return s if isinstance(s, bytes) else s.encode()


@pytest.mark.parametrize("case", range(len(SPM_CASES)))
def test_spm_hand_cases(spm, tmp_path, case):
    text, want = SPM_CASES[case]
    data = as_bytes(text)
    for model in spm:
        assert tokenize(model, data, tmp_path) == want, (model, text)
        assert tokenizer_ref.load(str(model)).encode(data) == want, ("reference", model, text)


@pytest.mark.parametrize("case", range(len(BPE_CASES)))
def test_bpe_hand_cases(bpe, tmp_path, case):
    text, want = BPE_CASES[case]
    data = as_bytes(text)
    for model in bpe:
        assert tokenize(model, data, tmp_path) == want, (model, text)
        assert tokenizer_ref.load(str(model)).encode(data) == want, ("reference", model, text)


def test_qwen2_family_differs(qwen, tmp_path):
    for text, want in QWEN_CASES:
        for model in qwen:
            assert tokenize(model, text.encode(), tmp_path) == want, (model, text)
            assert tokenizer_ref.load(str(model)).encode(text.encode()) == want


def test_flags_no_bos_no_special(bpe, tmp_path):
    gguf = bpe[0]
    assert tokenize(gguf, b"the", tmp_path, ("--no-bos",)) == [ord("t"), 257]
    ids = tokenize(gguf, b"<|end_of_text|>", tmp_path, ("--no-bos", "--no-special"))
    assert EOS not in ids and detok_bytes(gguf, ids, tmp_path) == b"<|end_of_text|>"
    p = run([PPSERVE, "tokenize", "--model", str(gguf), "the"])
    assert p.stdout.strip() == f"{BOS},{ord('t')},257"


POOL = (list("abcxyz ABC") + [" ", "  ", "\n", "\t", "\r\n", "0", "12", "345", "'s", "'T", ".", ",",
        "!", "?", "-", "日", "本", "語", "한", "é", "ß", "ñ", "😀", "🎉", "\u2581", "<s>", "€",
        "\u00a0", "\u3000", "<tag>", "<|end_of_text|>", "the", " the", "he"])


def random_texts(seed, n):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = [rng.choice(POOL) for _ in range(rng.randint(0, 12))]
        data = "".join(parts).encode()
        if rng.random() < 0.25:  # sprinkle invalid bytes
            pos = rng.randint(0, len(data))
            bad = bytes([rng.choice([0x80, 0xbf, 0xc3, 0xe6, 0xf0, 0xff])])
            data = data[:pos] + bad + data[pos:]
        out.append(data)
    return out


@pytest.mark.parametrize("family", ["spm", "bpe", "qwen"])
def test_random_strings_match_reference_and_formats(family, spm, bpe, qwen, tmp_path):
    gguf, hf = {"spm": spm, "bpe": bpe, "qwen": qwen}[family]
    ref = tokenizer_ref.load(str(gguf))
    for data in random_texts({"spm": 1, "bpe": 2, "qwen": 3}[family], 60):
        a = tokenize(gguf, data, tmp_path)
        assert a == ref.encode(data), data
        assert tokenize(hf, data, tmp_path) == a, ("GGUF and tokenizer.json differ", data)
        # round trip: every byte sequence comes back unchanged, except special-token text (it
        # becomes a token that decodes to nothing) and, for SentencePiece, a literal ▁ (it is
        # the space marker itself, so it decodes as a space, as in SentencePiece)
        if b"<" not in data and (family != "spm" or M.encode() not in data):
            assert detok_bytes(gguf, a, tmp_path) == data, data


@pytest.mark.parametrize("kind", ["spm", "bpe"])
def test_synth_tokenizer_matches_reference(models, tmp_path, kind):
    root = models.get(f"tok_{kind}", "--dim", "32", "--layers", "1", "--heads", "2", "--ffn",
                      "64", "--vocab", "700", "--ctx", "64", "--tokenizer", kind)
    texts = [b"The old lighthouse stood at the end of a narrow road.",
             b"  Two  spaces\nand a newline, digits 2026 and 3.14159!",
             "Caf\u00e9 \u65e5\u672c\u8a9e \U0001F600 don't WE'LL".encode(), b"\xff\xfe bad \xc3"]
    texts += random_texts(7, 25)
    ref = tokenizer_ref.load(str(root / "model.gguf"))
    ref_hf = tokenizer_ref.load(str(root / "hf"))
    for data in texts:
        a = tokenize(root / "model.gguf", data, tmp_path)
        assert a == ref.encode(data) == ref_hf.encode(data), data
        assert tokenize(root / "hf", data, tmp_path) == a, data
        assert a[0] == (1 if kind == "spm" else 256), "BOS per the model's add_bos"
        if b"<" not in data and (kind != "spm" or M.encode() not in data):
            assert detok_bytes(root / "hf", a, tmp_path) == data


def test_run_prompt_adds_bos_for_byte_level(models):
    root = models.get("tok_bpe", "--dim", "32", "--layers", "1", "--heads", "2", "--ffn",
                      "64", "--vocab", "700", "--ctx", "64", "--tokenizer", "bpe")
    outs = []
    for path in (root / "model.gguf", root / "hf"):
        p = run([PPSERVE, "run", "--model", str(path), "--prompt", "Once upon a time",
                 "--max-tokens", "6", "--json", "--ignore-eos"])
        outs.append(json.loads(p.stdout))
    assert outs[0]["prompt_ids"][0] == 256
    assert outs[0]["prompt_ids"] == outs[1]["prompt_ids"]
    assert outs[0]["ids"] == outs[1]["ids"] and outs[0]["text"] == outs[1]["text"]


def test_random_bytes_never_crash(spm, bpe, tmp_path):
    rng = random.Random(11)
    for model in (*spm, *bpe):
        for _ in range(8):
            data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 400)))
            data = data.replace(b"\x00", b"\x01")
            ids = tokenize(model, data, tmp_path, ("--no-special",))
            assert all(isinstance(i, int) for i in ids)


def test_errors(spm, tmp_path):
    gguf, hf = spm
    for args, needle in [
        (["detokenize", "--model", str(gguf), "1,9999"], "outside the vocabulary"),
        (["detokenize", "--model", str(gguf), "1,x"], "ids"),
        (["detokenize", "--model", str(gguf), "-3"], ""),
        (["tokenize", "--model", str(tmp_path / "missing.gguf"), "hi"], "missing"),
        (["tokenize", "hi"], "--model"),
    ]:
        p = run([PPSERVE, *args], check=False)
        assert p.returncode != 0, args
        assert needle in p.stderr, (args, p.stderr)
        assert "Segmentation" not in p.stderr
    # a GGUF without tokenizer metadata
    (tmp_path / "bare.gguf").write_bytes(gguf_bytes([("general.architecture", "str", "llama")]))
    p = run([PPSERVE, "tokenize", "--model", str(tmp_path / "bare.gguf"), "hi"], check=False)
    assert p.returncode != 0 and "no tokenizer" in p.stderr
    # unsupported kinds say so
    wp = tmp_path / "wp"
    wp.mkdir()
    (wp / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {}}}))
    p = run([PPSERVE, "tokenize", "--model", str(wp), "hi"], check=False)
    assert p.returncode != 0 and "WordPiece" in p.stderr and "not supported" in p.stderr


def test_bench_one_megabyte(models, tmp_path):
    """Encoding speed: prints MB/s on 1 MB of mixed text (the figure goes in the report)."""
    rng = random.Random(5)
    words = ["the", "lighthouse", "keeper", "climbed", "stairs", "12345", "日本語", "café", "😀",
             "don't", "\n", "  ", ",", "."]
    text = " ".join(rng.choice(words) for _ in range(200000)).encode()[:1 << 20]
    f = tmp_path / "bench.txt"
    f.write_bytes(text)
    for kind in ("spm", "bpe"):
        root = models.get(f"tok_{kind}", "--dim", "32", "--layers", "1", "--heads", "2", "--ffn",
                          "64", "--vocab", "700", "--ctx", "64", "--tokenizer", kind)
        p = run([PPSERVE, "tokenize", "--model", str(root / "model.gguf"), "--bench", str(f),
                 "--json"])
        r = json.loads(p.stdout)
        print(f"\n{kind}: {r['mb_per_s']:.1f} MB/s ({r['tokens']} tokens)")
        # the 1-second bar is held by tests/unit/test_tokenizer.c on plain builds; here only a
        # guard against quadratic behaviour that also holds under sanitizers
        assert r["seconds"] < 10.0, r


def test_metaspace_pre_tokenizer(spm, tmp_path):
    """The Mistral / Llama 2 (legacy=false) form of the SentencePiece vocabulary: no normalizer,
    a Metaspace pre-tokenizer with prepend_scheme "first": the ▁ goes only before the start of the
    text, and not when the text already starts with a space."""
    hf = tmp_path / "meta"
    hf.mkdir()
    tj = json.loads((spm[1] / "tokenizer.json").read_text())
    tj["normalizer"] = None
    tj["pre_tokenizer"] = {"type": "Metaspace", "replacement": M, "prepend_scheme": "first",
                           "split": True}
    tj["decoder"] = {"type": "Metaspace", "replacement": M, "prepend_scheme": "first",
                     "split": True}
    (hf / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    (hf / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    ref = tokenizer_ref.load(str(hf))
    for text, want in [
        ("ab", [1, I[M + "ab"]]),
        (" a", [1, I[M + "a"]]),                         # already starts with ▁: no prefix
        ("a<tag>b", [1, I[M + "a"], I["<tag>"], I["b"]]),  # "b" is not at the start: no ▁
        ("ab ab", [1, I[M + "ab"], I[M + "ab"]]),        # split before each ▁
    ]:
        assert tokenize(hf, text.encode(), tmp_path) == want, text
        assert ref.encode(text.encode()) == want, text
    assert detok_bytes(hf, [1, I[M + "ab"], I[M + "ab"]], tmp_path) == b"ab ab"


def test_gpt2_byte_level_with_prefix_space(bpe, tmp_path):
    """GPT-2's own form: a ByteLevel pre-tokenizer with its regex and add_prefix_space, no BOS."""
    hf = tmp_path / "gpt2"
    hf.mkdir()
    tj = json.loads((bpe[1] / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                           "use_regex": True}
    tj["post_processor"] = {"type": "ByteLevel", "trim_offsets": True}
    tj["model"]["ignore_merges"] = False
    (hf / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    ref = tokenizer_ref.load(str(hf))
    for text, want in [
        ("the", [258]),                                  # " the": Ġt, he, Ġthe
        ("12345", [32, 260, ord("4"), ord("5")]),        # " 12345" one piece: Ġ 123 4 5
        ("a  b", [32, ord("a"), 32, 32, ord("b")]),      # " a" " " " b"
    ]:
        assert tokenize(hf, text.encode(), tmp_path) == want, text
        assert ref.encode(text.encode()) == want, text


def test_unsupported_models_say_so(tmp_path):
    for kind in ("Unigram", "WordLevel"):
        d = tmp_path / kind
        d.mkdir()
        (d / "tokenizer.json").write_text(json.dumps({"model": {"type": kind, "vocab": []}}))
        p = run([PPSERVE, "tokenize", "--model", str(d), "hi"], check=False)
        assert p.returncode != 0 and kind in p.stderr and "token ids" in p.stderr


def test_unsupported_tokenizer_still_runs_from_ids(models, tmp_path):
    import shutil
    root = models.get("tok_spm", "--dim", "32", "--layers", "1", "--heads", "2", "--ffn",
                      "64", "--vocab", "700", "--ctx", "64", "--tokenizer", "spm")
    hf = tmp_path / "hf"
    shutil.copytree(root / "hf", hf)
    (hf / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordPiece",
                                                              "vocab": {"a": 0}}}))
    p = run([PPSERVE, "run", "--model", str(hf), "--prompt-ids", "1,5,9", "--max-tokens", "3",
             "--json"])
    assert len(json.loads(p.stdout)["ids"]) == 3
    p = run([PPSERVE, "run", "--model", str(hf), "--prompt", "hi"], check=False)
    assert p.returncode != 0 and "WordPiece" in p.stderr


def test_malformed_tokenizer_files(tmp_path):
    bad_json = [
        {"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}},
        {"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}},
        {"model": {"type": "BPE", "vocab": {"a": 0}, "merges": "nope"}},
        {"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a"], 7, "a"]},
         "added_tokens": [{"id": 1 << 30, "content": "x"}]},
        {"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
         "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"},
                           "behavior": "Isolated"}},
        {"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
         "normalizer": {"type": "Lowercase"}},
    ]
    for k, tj in enumerate(bad_json):
        d = tmp_path / f"bad{k}"
        d.mkdir()
        (d / "tokenizer.json").write_text(json.dumps(tj))
        p = run([PPSERVE, "tokenize", "--model", str(d), "a"], check=False)
        assert p.returncode != 0 and "error" in p.stderr, (tj, p.stderr)
        assert "Segmentation" not in p.stderr and "Aborted" not in p.stderr
    # merges naming tokens that do not exist are skipped, as are malformed entries
    d = tmp_path / "odd"
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps(
        {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2},
                   "merges": ["a b", "a zz", "nospace", ["b"], ["a", "b"]]}}))
    assert tokenize(d, b"abab", tmp_path) == [2, 2]
    # GGUF: token_type of the wrong length, merges missing for gpt2
    f = tmp_path / "bad.gguf"
    f.write_bytes(gguf_bytes([("tokenizer.ggml.model", "str", "llama"),
                              ("tokenizer.ggml.tokens", "strs", ["a", "b"]),
                              ("tokenizer.ggml.token_type", "i32s", [1])]))
    p = run([PPSERVE, "tokenize", "--model", str(f), "a"], check=False)
    assert p.returncode != 0 and "token_type" in p.stderr
    f.write_bytes(gguf_bytes([("tokenizer.ggml.model", "str", "gpt2"),
                              ("tokenizer.ggml.tokens", "strs", ["a", "b"])]))
    p = run([PPSERVE, "tokenize", "--model", str(f), "a"], check=False)
    assert p.returncode != 0 and "merges" in p.stderr
    f.write_bytes(gguf_bytes([("tokenizer.ggml.model", "str", "gpt2"),
                              ("tokenizer.ggml.pre", "str", "made-up"),
                              ("tokenizer.ggml.tokens", "strs", ["a", "b"]),
                              ("tokenizer.ggml.merges", "strs", [])]))
    p = run([PPSERVE, "tokenize", "--model", str(f), "a"], check=False)
    assert p.returncode != 0 and "made-up" in p.stderr and "not supported" in p.stderr
