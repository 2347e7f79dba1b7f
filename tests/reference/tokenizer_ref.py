"""Reference tokenizer for the tests: SentencePiece-style and byte-level BPE, read from GGUF
metadata or an HF tokenizer.json, written from the format descriptions alone and sharing nothing
with ppserve's C tokenizer. It is deliberately naive (every merge step rescans the whole piece) so
that its results are easy to trust; speed is not its job.

Text is handled as bytes. Invalid UTF-8 never matches a pre-tokenizer regex: the regex runs on
each maximal valid stretch of the text, and every byte no match covers (invalid bytes, and any
valid text a pattern leaves out) becomes a piece of its own, in order, so no byte is lost.

Usage: tokenizer_ref.py --model PATH [--no-bos] [--no-special] (--text T | --texts-json FILE)
prints {"ids": [...]} (or {"ids": [[...], ...]} for a JSON list of strings; a string may carry
invalid bytes as "\\udcXX" surrogate escapes), or with --decode 1,2,3 prints {"text_hex": "..."}.
Needs Debian's `python3-regex` for \\p{L} and \\p{N} (run it with /usr/bin/python3).
"""
import argparse
import json
import os
import sys

import regex

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_reader import GGUFFile  # noqa: E402

META = "\u2581".encode()  # SentencePiece's visible space

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
FAMILIES = {"llama-bpe": LLAMA3, "llama3": LLAMA3, "llama-v3": LLAMA3, "qwen2": QWEN2,
            "gpt2": GPT2, "default": GPT2}

NORMAL, UNKNOWN, CONTROL, USER, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def gpt2_alphabet():
    """byte -> the character that stands for it (GPT-2's bytes_to_unicode)."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1))
            + list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_CHAR = gpt2_alphabet()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def regex_split(pattern, data):
    """Matches of pattern in data (bytes) and the bytes between them, as a list of bytes."""
    text = data.decode("utf-8", "surrogateescape")
    cuts = []  # (start, end) byte offsets of matches
    pos_bytes = 0
    i = 0
    while i < len(text):
        if "\udc80" <= text[i] <= "\udcff":
            pos_bytes += 1
            i += 1
            continue
        j = i
        while j < len(text) and not ("\udc80" <= text[j] <= "\udcff"):
            j += 1
        run = text[i:j]
        offsets = [0]
        for ch in run:
            offsets.append(offsets[-1] + len(ch.encode()))
        for m in pattern.finditer(run):
            if m.end() > m.start():
                cuts.append((pos_bytes + offsets[m.start()], pos_bytes + offsets[m.end()]))
        pos_bytes += offsets[-1]
        i = j
    pieces, last = [], 0
    for s, e in cuts:
        if s > last:
            pieces.append(data[last:s])
        pieces.append(data[s:e])
        last = e
    if last < len(data):
        pieces.append(data[last:])
    return pieces


def utf8_chars(data):
    """data split into characters; an invalid byte is a character of its own."""
    out, i = [], 0
    while i < len(data):
        for n in (4, 3, 2, 1):
            chunk = data[i:i + n]
            if len(chunk) == n:
                try:
                    if len(chunk.decode("utf-8")) == 1:
                        break
                except UnicodeDecodeError:
                    pass
        else:
            n = 1
        out.append(data[i:i + n])
        i += n
    return out


class Tokenizer:
    def __init__(self):
        self.pieces = []          # id -> bytes
        self.types = []           # id -> token type
        self.scores = []
        self.ids = {}             # bytes -> first id
        self.ranks = {}           # (left bytes, right bytes) -> rank
        self.by_score = False     # SentencePiece: best score; else lowest rank
        self.byte_level = False
        self.byte_fallback = False
        self.ignore_merges = False
        self.meta_decode = False
        self.strip_space = False
        self.norm = []            # ("prepend", s) | ("replace", a, b), on bytes
        # ("split", compiled) | ("metaspace", rep, scheme, split) | ("prefix",)
        self.pre = []
        self.bos = self.eos = self.unk = -1
        self.add_bos = False

    # ---- loading ----
    def _set_vocab(self, pieces, types):
        self.pieces, self.types = pieces, types
        for i, p in enumerate(pieces):
            self.ids.setdefault(p, i)

    def byte_token(self, b):
        i = self.ids.get(b"<0x%02X>" % b)
        return i if i is not None and self.types[i] in (NORMAL, BYTE) else None

    @classmethod
    def from_gguf(cls, path):
        md = GGUFFile(path).metadata
        t = cls()
        model = md.get("tokenizer.ggml.model")
        if model is None:
            raise ValueError("no tokenizer")
        toks = [s.encode("utf-8", "surrogateescape") for s in md["tokenizer.ggml.tokens"]]
        types = list(md.get("tokenizer.ggml.token_type", [NORMAL] * len(toks)))
        t._set_vocab(toks, types)
        t.scores = list(md.get("tokenizer.ggml.scores", [0.0] * len(toks)))
        if model == "llama":
            t.by_score = t.byte_fallback = t.meta_decode = True
            prefix = md.get("tokenizer.ggml.add_space_prefix", True)
            t.strip_space = prefix
            if prefix:
                t.norm.append(("prepend", META))
            t.norm.append(("replace", b" ", META))
            add_bos_default = True
        elif model == "gpt2":
            pre = md.get("tokenizer.ggml.pre", "default")
            t.byte_level = True
            t.ignore_merges = pre in ("llama-bpe", "llama3", "llama-v3")
            t.pre.append(("split", regex.compile(FAMILIES[pre])))
            for r, m in enumerate(md["tokenizer.ggml.merges"]):
                a, b = m.encode().split(b" ", 1)
                t._add_merge(a, b, r)
            add_bos_default = t.ignore_merges
        else:
            raise ValueError(f"unsupported tokenizer {model}")
        t.bos = md.get("tokenizer.ggml.bos_token_id", -1)
        t.eos = md.get("tokenizer.ggml.eos_token_id", -1)
        t.unk = md.get("tokenizer.ggml.unknown_token_id", -1)
        t.add_bos = md.get("tokenizer.ggml.add_bos_token", add_bos_default)
        return t

    def _add_merge(self, a, b, rank):
        if a in self.ids and b in self.ids and a + b in self.ids:
            self.ranks.setdefault((a, b), rank)

    @classmethod
    def from_hf(cls, folder):
        with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
            tj = json.load(f)
        t = cls()
        model = tj["model"]
        if model.get("type", "BPE") != "BPE":
            raise ValueError(f"unsupported model {model.get('type')}")
        n = max(list(model["vocab"].values()) + [a["id"] for a in tj.get("added_tokens", [])]) + 1
        pieces, types = [None] * n, [0] * n
        for a in tj.get("added_tokens", []):
            if pieces[a["id"]] is None:
                pieces[a["id"]] = a["content"].encode()
                types[a["id"]] = CONTROL if a.get("special") else USER
        for s, i in model["vocab"].items():
            if pieces[i] is None:
                pieces[i] = s.encode()
                types[i] = NORMAL
        for i in range(n):
            if pieces[i] is None:
                pieces[i], types[i] = b"", UNUSED
            elif types[i] == NORMAL and len(pieces[i]) == 6 and pieces[i].startswith(b"<0x"):
                types[i] = BYTE
        t._set_vocab(pieces, types)
        t.scores = [0.0] * n
        for r, m in enumerate(model["merges"]):
            a, b = (m.split(" ", 1) if isinstance(m, str) else m)
            t._add_merge(a.encode(), b.encode(), r)
        t.byte_fallback = bool(model.get("byte_fallback"))
        t.ignore_merges = bool(model.get("ignore_merges"))
        if model.get("unk_token"):
            t.unk = t.ids.get(model["unk_token"].encode(), -1)
        t._hf_normalizer(tj.get("normalizer"))
        t._hf_pre(tj.get("pre_tokenizer"))
        t._hf_decoder(tj.get("decoder"))
        t._hf_bos(folder, tj)
        return t

    def _hf_normalizer(self, n):
        if not n:
            return
        for op in (n["normalizers"] if n["type"] == "Sequence" else [n]):
            if op["type"] == "Prepend":
                self.norm.append(("prepend", op["prepend"].encode()))
            elif op["type"] == "Replace":
                a, b = op["pattern"]["String"].encode(), op["content"].encode()
                self.norm.append(("replace", a, b))
                self.meta_decode |= (a, b) == (b" ", META)
            elif op["type"] != "NFC":
                raise ValueError(f"unsupported normalizer {op['type']}")

    def _hf_pre(self, p):
        if not p:
            return
        for st in (p["pretokenizers"] if p["type"] == "Sequence" else [p]):
            if st["type"] == "Split":
                pat = st["pattern"]
                src = pat["Regex"] if "Regex" in pat else regex.escape(pat["String"])
                self.pre.append(("split", regex.compile(src)))
            elif st["type"] == "ByteLevel":
                self.byte_level = True
                if st.get("add_prefix_space"):
                    self.pre.append(("prefix",))
                if st.get("use_regex", True):
                    self.pre.append(("split", regex.compile(GPT2)))
            elif st["type"] == "Metaspace":
                scheme = st.get("prepend_scheme",
                                "always" if st.get("add_prefix_space", True) else "never")
                self.pre.append(("metaspace", st.get("replacement", "\u2581").encode(), scheme,
                                 st.get("split", True)))
                self.meta_decode = True
            else:
                raise ValueError(f"unsupported pre-tokenizer {st['type']}")

    def _hf_decoder(self, d):
        for op in ((d["decoders"] if d["type"] == "Sequence" else [d]) if d else []):
            if op["type"] == "Strip" and op.get("start", 0) > 0:
                self.strip_space = True
            if op["type"] == "Replace" and op["pattern"].get("String") == "\u2581":
                self.meta_decode = True
            if op["type"] == "Metaspace":
                self.meta_decode = True
                self.strip_space = op.get("prepend_scheme", "always") != "never"

    def _hf_bos(self, folder, tj):
        def template_bos(pp):
            if not pp:
                return None
            if pp["type"] == "Sequence":
                for q in pp["processors"]:
                    r = template_bos(q)
                    if r is not None:
                        return r
                return None
            if pp["type"] != "TemplateProcessing" or "SpecialToken" not in pp["single"][0]:
                return None
            name = pp["single"][0]["SpecialToken"]["id"]
            return pp["special_tokens"][name]["ids"][0]
        tb = template_bos(tj.get("post_processor"))
        cfg = {}
        if os.path.exists(os.path.join(folder, "config.json")):
            with open(os.path.join(folder, "config.json")) as f:
                cfg = json.load(f)
        bos, eos = cfg.get("bos_token_id"), cfg.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0]
        self.bos = bos if isinstance(bos, int) else (tb if tb is not None else -1)
        self.eos = eos if isinstance(eos, int) else -1
        self.add_bos = tb is not None
        tcp = os.path.join(folder, "tokenizer_config.json")
        if os.path.exists(tcp):
            with open(tcp) as f:
                tc = json.load(f)
            if isinstance(tc.get("add_bos_token"), bool):
                self.add_bos = tc["add_bos_token"]

    # ---- encoding ----
    def specials(self):
        return sorted((i for i, ty in enumerate(self.types)
                       if ty in (CONTROL, USER, UNKNOWN) and self.pieces[i]),
                      key=lambda i: (-len(self.pieces[i]), i))

    def encode(self, data, add_bos=None, parse_special=True):
        if add_bos is None:
            add_bos = self.add_bos
        ids = [self.bos] if add_bos and self.bos >= 0 else []
        specials = self.specials() if parse_special else []
        seg_start, i = 0, 0
        while i < len(data):
            hit = next((s for s in specials if data.startswith(self.pieces[s], i)), None)
            if hit is None:
                i += 1
                continue
            if i > seg_start:
                ids += self._segment(data[seg_start:i], seg_start == 0)
            ids.append(hit)
            i += len(self.pieces[hit])
            seg_start = i
        if seg_start < len(data):
            ids += self._segment(data[seg_start:], seg_start == 0)
        return ids

    def _segment(self, data, first):
        for op in self.norm:
            if not data:
                break
            data = op[1] + data if op[0] == "prepend" else data.replace(op[1], op[2])
        pieces = [data] if data else []
        for st in self.pre:
            out = []
            for k, p in enumerate(pieces):
                if st[0] == "split":
                    out += regex_split(st[1], p)
                elif st[0] == "prefix":
                    out.append(p if p.startswith(b" ") else b" " + p)
                else:
                    _, rep, scheme, split = st
                    q = p.replace(b" ", rep)
                    want = scheme == "always" or (scheme == "first" and first and k == 0)
                    if want and not q.startswith(rep):
                        q = rep + q
                    if not split:
                        out.append(q)
                        continue
                    parts = q.split(rep)
                    cur = parts[0]
                    for part in parts[1:]:
                        if cur:
                            out.append(cur)
                        cur = rep + part
                    if cur:
                        out.append(cur)
            pieces = out
        ids = []
        for p in pieces:
            ids += self._piece(p)
        return ids

    def _piece(self, p):
        if self.byte_level:
            p = "".join(BYTE_TO_CHAR[b] for b in p).encode()
        if self.ignore_merges and p in self.ids:
            return [self.ids[p]]
        syms = utf8_chars(p)
        while len(syms) > 1:
            best = None
            for k in range(len(syms) - 1):
                a, b = syms[k], syms[k + 1]
                if self.by_score:
                    tid = self.ids.get(a + b)
                    if tid is None:
                        continue
                    key = (-self.scores[tid], k)
                else:
                    if a not in self.ids or b not in self.ids or (a, b) not in self.ranks:
                        continue
                    key = (self.ranks[(a, b)], k)
                if best is None or key < best:
                    best = key
            if best is None:
                break
            k = best[1]
            syms[k:k + 2] = [syms[k] + syms[k + 1]]
        ids = []
        for s in syms:
            if s in self.ids:
                ids.append(self.ids[s])
            elif self.byte_fallback and not self.byte_level and all(
                    self.byte_token(b) is not None for b in s):
                ids += [self.byte_token(b) for b in s]
            elif self.unk >= 0:
                ids.append(self.unk)
        return ids

    # ---- decoding ----
    def piece(self, i):
        ty, p = self.types[i], self.pieces[i]
        if ty in (CONTROL, UNKNOWN, UNUSED):
            return b""
        if ty == BYTE and not self.byte_level:
            return bytes([int(p[3:5], 16)])
        if ty == USER:
            return p
        if self.byte_level:
            return b"".join(bytes([CHAR_TO_BYTE[c]]) if c in CHAR_TO_BYTE else c.encode()
                            for c in p.decode("utf-8", "surrogateescape"))
        return p.replace(META, b" ") if self.meta_decode else p

    def decode(self, ids):
        out = b"".join(self.piece(i) for i in ids)
        return out[1:] if self.strip_space and out.startswith(b" ") else out


def load(path):
    return Tokenizer.from_hf(path) if os.path.isdir(path) else Tokenizer.from_gguf(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--text")
    ap.add_argument("--texts-json")
    ap.add_argument("--decode")
    ap.add_argument("--no-bos", action="store_true")
    ap.add_argument("--no-special", action="store_true")
    a = ap.parse_args()
    t = load(a.model)
    add_bos = False if a.no_bos else None
    if a.decode is not None:
        ids = [int(x) for x in a.decode.split(",") if x]
        print(json.dumps({"text_hex": t.decode(ids).hex()}))
    elif a.texts_json:
        with open(a.texts_json, encoding="utf-8") as f:
            texts = json.load(f)
        print(json.dumps({"ids": [t.encode(s.encode("utf-8", "surrogateescape"), add_bos,
                                           not a.no_special) for s in texts]}))
    else:
        print(json.dumps({"ids": t.encode(a.text.encode("utf-8", "surrogateescape"), add_bos,
                                          not a.no_special)}))


if __name__ == "__main__":
    main()
