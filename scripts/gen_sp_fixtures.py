#!/usr/bin/env python3
"""SentencePiece fixtures for issue 19 item 4 (tests/hf/test_sp_tokenizer.c), from PyPI's
`sentencepiece` and `tokenizers` (no transformers needed).

    pip install sentencepiece tokenizers
    python3 scripts/gen_sp_fixtures.py            # writes tests/fixtures/sp/

Corpus (deterministic, seed 19): documents = data/tinyshakespeare.txt cut into blocks of 30 lines, then the
documents of extra.txt (separated by U+001E), which this script builds: classical Chinese (public domain,
below) and generated CJK sentences, C code (files of this repo, copied so later edits do not matter),
emoji (ZWJ, flags, skin tones), whitespace runs (tabs, runs of spaces, CRLF, blank lines), digits, and
characters the normalizers change (full-width, ligatures, circled digits, NBSP, zero-width space,
decomposed accents) and rare scripts (byte fallback). The C test rebuilds the same document list.

Models (trained on every line of every document), all with byte_fallback:
    bpe.model      BPE, vocab 32000, Llama-2 settings: identity normalizer, add_dummy_prefix,
                   remove_extra_whitespaces=false, split_digits
    unigram.model  Unigram, vocab 32000, nmt_nfkc normalizer, remove_extra_whitespaces (the defaults)
    bpe.tokenizer.json  the BPE model as a Llama-2-style tokenizer.json built with `tokenizers`
                   (Prepend+Replace normalizer, BPE byte_fallback fuse_unk, merges extracted from the
                   pieces as transformers' converter does, Replace/ByteFallback/Fuse/Strip decoder)
Reference ids (ids_<name>.bin, little-endian): "SLSPIDS1", u32 ndocs, u32 width (2), u32 counts[ndocs],
u64 FNV-1a of the reference decode of each document, then the ids of every document (encoded
separately, no BOS) as u16. ids_bpe_json.bin only if tokenizers' ids differ from bpe.model's.
"""
import os
import random
import re
import struct
import sys

import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.join(HERE, "..")
OUT = os.path.join(REPO, "tests", "fixtures", "sp")
VOCAB = 32000
RS = "\x1e"

CLASSICAL = """道可道，非常道。名可名，非常名。無名天地之始；有名萬物之母。故常無欲，以觀其妙；常有欲，以觀其徼。此兩者，同出而異名，同謂之玄。玄之又玄，衆妙之門。
天下皆知美之爲美，斯惡已。皆知善之爲善，斯不善已。故有無相生，難易相成，長短相形，高下相傾，音聲相和，前後相隨。是以聖人處無爲之事，行不言之教；萬物作焉而不辭，生而不有，爲而不恃，功成而弗居。夫唯弗居，是以不去。
上善若水。水善利萬物而不爭，處衆人之所惡，故幾於道。居善地，心善淵，與善仁，言善信，政善治，事善能，動善時。夫唯不爭，故無尤。
子曰：學而時習之，不亦說乎？有朋自遠方來，不亦樂乎？人不知而不慍，不亦君子乎？
有子曰：其爲人也孝弟，而好犯上者，鮮矣；不好犯上，而好作亂者，未之有也。君子務本，本立而道生。孝弟也者，其爲仁之本與！
子曰：巧言令色，鮮矣仁！曾子曰：吾日三省吾身：爲人謀而不忠乎？與朋友交而不信乎？傳不習乎？
子曰：溫故而知新，可以爲師矣。子曰：學而不思則罔，思而不學則殆。子曰：知之爲知之，不知爲不知，是知也。
床前明月光，疑是地上霜。舉頭望明月，低頭思故鄉。
春眠不覺曉，處處聞啼鳥。夜來風雨聲，花落知多少。
白日依山盡，黃河入海流。欲窮千里目，更上一層樓。
天地玄黃，宇宙洪荒。日月盈昃，辰宿列張。寒來暑往，秋收冬藏。閏餘成歲，律呂調陽。雲騰致雨，露結爲霜。金生麗水，玉出崑岡。劍號巨闕，珠稱夜光。果珍李柰，菜重芥薑。海鹹河淡，鱗潛羽翔。
关关雎鸠，在河之洲。窈窕淑女，君子好逑。参差荇菜，左右流之。窈窕淑女，寤寐求之。
大学之道，在明明德，在亲民，在止于至善。知止而后有定，定而后能静，静而后能安，安而后能虑，虑而后能得。
"""

EMOJI = ["😀", "😂", "🥲", "👍", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🇨🇳", "🇺🇸", "❤️", "🔥", "🚀", "1️⃣", "🏳️‍🌈", "🐍",
         "🦀", "✨", "🎉", "🙏🏿", "🤖"]
NORM = ["ＡＢＣ", "ｔｏｋｅｎ", "１２３", "ﬁnance", "ﬂow", "①②③", "㍿", "™", "Ⅻ", "café", "cafe\u0301", "naïve",
        "a\u00a0b", "zero\u200bwidth", "½", "x²", "ｶﾀｶﾅ", "Ǆ", "ẞ", "\u3000全角空格"]
RARE = ["नमस्ते दुनिया", "مرحبا بالعالم", "안녕하세요 세계", "Здравствуй, мир", "γειά σου κόσμε", "שלום עולם",
        "∀x∈ℝ: x²≥0", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ᚠᚢᚦᚨᚱᚲ", "ሰላም ልዑል", "ⴰⵣⵓⵍ", "𓀀𓀁𓀂", "ꙮ", "𠀀𠀁𠜎"]
CODE_FILES = ["src/data/tokenizer.c", "src/data/tokenizer_bpe.c", "src/data/shards.c", "src/data/loader.c",
              "src/data/prepare.c", "src/cli/cmd_data.c", "include/suanli/data.h"]


def build_extra(rng):
    docs = []
    lines = [l for l in CLASSICAL.strip().split("\n")]
    for rep in range(6):  # classical Chinese, re-ordered paragraphs
        rng.shuffle(lines)
        docs.append("\n".join(lines) + "\n")
    pool = sorted(set(c for c in CLASSICAL if "\u4e00" <= c <= "\u9fff"))
    punct = "，。；：？！、"
    for _ in range(700):  # generated CJK sentences: mostly common characters, some random ones
        sents = []
        for _ in range(rng.randint(2, 6)):
            n = rng.randint(4, 24)
            s = "".join(rng.choice(pool) if rng.random() < 0.85 else chr(rng.randint(0x4E00, 0x9FA5))
                        for _ in range(n))
            sents.append(s + rng.choice(punct))
        if rng.random() < 0.3:
            sents.insert(rng.randint(0, len(sents)), " the 中文 mixed with English 2024年 ")
        docs.append("".join(sents) + "\n")
    for f in CODE_FILES:  # code, cut into chunks of 40 lines
        with open(os.path.join(REPO, f), encoding="utf-8") as fh:
            src = fh.read().split("\n")
        for i in range(0, len(src), 40):
            docs.append("\n".join(src[i:i + 40]) + "\n")
    for _ in range(1500):  # emoji, whitespace runs, digits, normalizer-sensitive and rare characters
        parts = []
        for _ in range(rng.randint(3, 12)):
            k = rng.random()
            if k < 0.2:
                parts.append("".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4))))
            elif k < 0.35:
                parts.append(rng.choice([" " * rng.randint(2, 9), "\t" * rng.randint(1, 3), "\r\n", "\n\n",
                                         " \t ", "    "]))
            elif k < 0.55:
                parts.append(rng.choice([str(rng.randint(0, 10 ** rng.randint(1, 12))),
                                         f"{rng.random() * 1000:.4f}", f"{rng.randint(1, 31):02d}/"
                                         f"{rng.randint(1, 12):02d}/{rng.randint(1900, 2100)}",
                                         "3.14159265358979323846", f"0x{rng.randint(0, 2 ** 32):08x}",
                                         "1,000,000", "-42", "1e-5"]))
            elif k < 0.67:
                parts.append(rng.choice(NORM))
            elif k < 0.77:
                parts.append(rng.choice(RARE))
            else:
                parts.append(rng.choice(["hello world", "The quick brown fox", "tokenizer", "don't stop",
                                         "well-known", "e.g.", "C++ and Rust", "naïve café", "  indented",
                                         "trailing   ", "email@example.com", "https://example.org/a?b=c"]))
            parts.append(rng.choice([" ", "", " ", "\n"]))
        docs.append("".join(parts))
    return docs


def documents():
    with open(os.path.join(REPO, "data", "tinyshakespeare.txt"), encoding="utf-8", newline="") as fh:
        sh = fh.read().split("\n")
    docs = ["\n".join(sh[i:i + 30]) + "\n" for i in range(0, len(sh), 30)]
    with open(os.path.join(OUT, "extra.txt"), encoding="utf-8", newline="") as fh:
        docs += fh.read().split(RS)
    return docs


def fnv64(b):
    h = 1469598103934665603
    for c in b:
        h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def write_ids(name, per_doc, decoded):
    with open(os.path.join(OUT, f"ids_{name}.bin"), "wb") as f:
        f.write(b"SLSPIDS1" + struct.pack("<II", len(per_doc), 2))
        f.write(struct.pack(f"<{len(per_doc)}I", *[len(d) for d in per_doc]))
        f.write(struct.pack(f"<{len(per_doc)}Q", *[fnv64(d.encode()) for d in decoded]))
        flat = [i for d in per_doc for i in d]
        assert max(flat) < 65536
        f.write(struct.pack(f"<{len(flat)}H", *flat))
    return sum(len(d) for d in per_doc)


def llama_json(model_path, out_path):
    """A Llama-2-style tokenizer.json of a SentencePiece BPE model (as transformers' LlamaConverter)."""
    from tokenizers import Tokenizer, AddedToken, decoders, models, normalizers, processors
    sp = spm.SentencePieceProcessor(model_file=model_path)
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    scores = {sp.id_to_piece(i): sp.get_score(i) for i in range(sp.get_piece_size())}
    merges = []
    for piece, score in scores.items():  # SentencePieceExtractor.extract
        local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda x: x[2], reverse=True)
    merges = [(a, b) for a, b, _ in merges]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.add_special_tokens([AddedToken("<unk>", normalized=False, special=True),
                            AddedToken("<s>", normalized=False, special=True),
                            AddedToken("</s>", normalized=False, special=True)])
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    tok.save(out_path, pretty=False)
    return Tokenizer.from_file(out_path)


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = random.Random(19)
    with open(os.path.join(OUT, "extra.txt"), "w", encoding="utf-8", newline="") as fh:
        fh.write(RS.join(build_extra(rng)))
    docs = documents()
    nbytes = sum(len(d.encode()) for d in docs)
    print(f"{len(docs)} documents, {nbytes} bytes")
    corpus = os.path.join(OUT, "corpus.tmp")
    with open(corpus, "w", encoding="utf-8") as fh:
        for d in docs:
            for line in d.split("\n"):
                if line.strip():
                    fh.write(line.replace("\r", "") + "\n")
    common = dict(input=corpus, vocab_size=VOCAB, byte_fallback=True, character_coverage=0.9995,
                  num_threads=2, bos_id=1, eos_id=2, unk_id=0, pad_id=-1, minloglevel=2)
    spm.SentencePieceTrainer.train(model_prefix=os.path.join(OUT, "bpe"), model_type="bpe",
                                   normalization_rule_name="identity", add_dummy_prefix=True,
                                   remove_extra_whitespaces=False, split_digits=True,
                                   allow_whitespace_only_pieces=True, **common)
    try:
        spm.SentencePieceTrainer.train(model_prefix=os.path.join(OUT, "unigram"), model_type="unigram", **common)
    except RuntimeError as e:  # the EM drops pieces with expected count < 0.5: the corpus bounds the vocab
        cap = int(re.search(r"<= (\d+)", str(e)).group(1)) // 1000 * 1000
        print(f"unigram: 32000 refused by the trainer ({str(e).split('] ')[-1]}); using {cap}")
        common["vocab_size"] = cap
        spm.SentencePieceTrainer.train(model_prefix=os.path.join(OUT, "unigram"), model_type="unigram", **common)
    os.remove(corpus)
    for name in ("bpe", "unigram"):
        os.remove(os.path.join(OUT, name + ".vocab"))
        sp = spm.SentencePieceProcessor(model_file=os.path.join(OUT, name + ".model"))
        per_doc = [sp.encode(d) for d in docs]
        n = write_ids(name, per_doc, [sp.decode(ids) for ids in per_doc])
        bad = sum(sp.decode(ids) != d for ids, d in zip(per_doc[:50], docs[:50]))
        print(f"{name}.model: vocab {sp.get_piece_size()}, {n} ids; decode != text in {bad} of the first 50")
    tj = llama_json(os.path.join(OUT, "bpe.model"), os.path.join(OUT, "bpe.tokenizer.json"))
    sp = spm.SentencePieceProcessor(model_file=os.path.join(OUT, "bpe.model"))
    per_doc = [tj.encode(d, add_special_tokens=False).ids for d in docs]
    same = sum(a == sp.encode(d) for a, d in zip(per_doc, docs))
    print(f"bpe.tokenizer.json: {same} of {len(docs)} documents give the same ids as bpe.model")
    if same != len(docs):
        write_ids("bpe_json", per_doc, [tj.decode(ids, skip_special_tokens=False) for ids in per_doc])
    dj = sum(tj.decode(ids, skip_special_tokens=False) == d for ids, d in zip(per_doc, docs))
    print(f"bpe.tokenizer.json: decode(encode(x)) == x for {dj} of {len(docs)} documents")
    for f in sorted(os.listdir(OUT)):
        print(f"  {f}: {os.path.getsize(os.path.join(OUT, f))} bytes")


if __name__ == "__main__":
    sys.exit(main())
