#!/usr/bin/env python3
"""Deterministic text corpora for the tokenizer's exactness test and benchmark.

Pure Python (no third-party packages), so it runs here and on the GPU machine
and gives the same strings on both:

  tokenizer_corpus.py golden OUT.jsonl          # >= 3000 strings, every category
  tokenizer_corpus.py bench --megabytes 10 OUT.jsonl   # mixed documents, ~10 MB

Output: one JSON string per line (separated by '\n' only: the strings may hold
U+2028 and other characters that str.splitlines() would split on).

The categories follow issue 3: English prose, code in several languages,
Chinese, Japanese, Korean, Arabic, Hindi, emoji and ZWJ sequences, combining
marks, long digit runs, every whitespace shape, punctuation runs, special
tokens embedded in text, and very long inputs; plus random Unicode fuzz.
"""
import argparse
import json
import random
import sys

ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, and nobody could say why the printers kept failing.",
    "She said, \"Don't worry; we'll fix it tomorrow,\" and then she left.",
    "In 1969, astronauts walked on the Moon for the first time.",
    "Tokenizers split text into pieces that a language model can read.",
    "Why would anyone write a server in C++? Speed, mostly, and control.",
    "The committee's report (released on Tuesday) recommends three changes.",
    "I've been waiting for hours -- isn't the train supposed to arrive at 5:45?",
    "Prices rose by 3.5% in March, the fastest pace since 2008.",
    "He couldn't believe it wasn't butter.",
    "Mr. Smith's dog, Rex, barked at the mailman every single morning.",
    "Please read the attached file and reply by e-mail before Friday.",
    "The mitochondria is the powerhouse of the cell.",
    "A journey of a thousand miles begins with a single step.",
    "They're going to the store, but their car is in the shop over there.",
    "Large language models predict the next token given the previous ones.",
    "Wait... what? You're telling me it worked the FIRST time?!",
    "Rust's borrow checker rejects code that would race on shared data.",
    "Call me at (555) 123-4567 or write to jane.doe@example.com.",
    "The URL is https://example.org/path/to/page?query=1&lang=en#section-2.",
    "HELLO WORLD, THIS IS A TEST OF THE EMERGENCY BROADCAST SYSTEM.",
    "camelCaseIdentifiers and snake_case_names look different to a tokenizer.",
    "We hold these truths to be self-evident, that all men are created equal.",
    "O'Neill and D'Angelo met at the café near the Champs-Élysées.",
    "The naïve coördinator's résumé mentioned a piñata and a jalapeño.",
    "Version 2.0.1-beta was released on 2024-03-15T08:30:00Z.",
    "Add two cups of flour, a pinch of salt, and 1/2 teaspoon of sugar.",
    "To be, or not to be, that is the question.",
    "The temperature dropped to -12°C overnight; the pipes froze.",
    "Mixture-of-experts layers route each token to a few of many experts.",
]

CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "import numpy as np\n\nx = np.arange(10)\nprint(x.reshape(2, 5).T @ x[:2])\n",
    "class Cache:\n    def __init__(self):\n        self._items = {}\n\n    def get(self, key, default=None):\n        return self._items.get(key, default)\n",
    "#include <vector>\n\nint main() {\n  std::vector<int> v{1, 2, 3};\n  for (auto& x : v) x *= 2;\n  return v[0] + v[2];\n}\n",
    "template <typename T>\nT clamp(T x, T lo, T hi) { return x < lo ? lo : (x > hi ? hi : x); }\n",
    "fn main() {\n    let words: Vec<&str> = \"a b c\".split(' ').collect();\n    println!(\"{:?}\", words);\n}\n",
    "impl<T: Clone> Stack<T> {\n    pub fn peek(&self) -> Option<&T> { self.items.last() }\n}\n",
    "function debounce(fn, ms) {\n  let t;\n  return (...args) => {\n    clearTimeout(t);\n    t = setTimeout(() => fn(...args), ms);\n  };\n}\n",
    "const user = { name: 'Ada', age: 36 };\nconsole.log(`Hello, ${user.name}!`);\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tch := make(chan int)\n\tgo func() { ch <- 42 }()\n\tfmt.Println(<-ch)\n}\n",
    "SELECT u.id, COUNT(o.id) AS orders\nFROM users u\nLEFT JOIN orders o ON o.user_id = u.id\nWHERE u.created_at >= '2024-01-01'\nGROUP BY u.id\nHAVING COUNT(o.id) > 3;\n",
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}'\ndone\n",
    "<!DOCTYPE html>\n<html>\n  <body>\n    <div class=\"box\" id='main'>Hi &amp; bye</div>\n  </body>\n</html>\n",
    "{\n  \"name\": \"mlaserve\",\n  \"version\": \"0.1.0\",\n  \"deps\": [\"fmt\", \"spdlog\"],\n  \"nested\": {\"a\": null, \"b\": true}\n}\n",
    "public static void main(String[] args) {\n    System.out.println(\"x=\" + args.length);\n}\n",
    "x <- c(1, 2, 3)\nmean(x[x > 1])\n",
    "SUBROUTINE AXPY(N, A, X, Y)\n  DO I = 1, N\n    Y(I) = Y(I) + A * X(I)\n  END DO\nEND\n",
    "    if (ptr != nullptr && *ptr >= 0x7F) { --count; ptr++; }\n",
    "a += b; c -= d; e *= f; g /= h; i %= j; k <<= 2; l >>= 3; m ^= n; o |= p; q &= r;\n",
    "match value {\n    Some(x) if x > 0 => x,\n    Some(_) | None => 0,\n}\n",
    "// TODO(someone): handle the edge case where len == 0\n/* block\n   comment */\n",
    "lambda x: [y**2 for y in range(x) if y % 3 == 0]\n",
    "$ docker run --rm -it -v $(pwd):/work ubuntu:24.04 /bin/bash\n",
    "diff --git a/src/main.cc b/src/main.cc\n@@ -1,3 +1,4 @@\n-int x = 1;\n+int x = 2;\n+int y = 3;\n",
]

CHINESE = [
    "今天天气很好，我们一起去公园散步吧。",
    "人工智能正在改变我们的生活方式。",
    "这个模型使用了混合专家架构和多头潜在注意力。",
    "北京是中华人民共和国的首都，有着悠久的历史。",
    "请把文件发送到我的邮箱，谢谢！",
    "他说：“我明天早上八点到。”",
    "学而时习之，不亦说乎？有朋自远方来，不亦乐乎？",
    "深度学习需要大量的数据和计算资源",
    "我们在2024年3月发布了第3版软件。",
    "服务器的吞吐量提高了百分之四十五",
    "长江是亚洲最长的河流，全长约6300公里。",
    "繁體中文與簡體中文在字形上有所不同。",
]

JAPANESE = [
    "今日はとても良い天気ですね。",
    "東京駅から新幹線で大阪へ行きます。",
    "このプログラムはカタカナとひらがなを正しく処理できますか？",
    "私はコーヒーが好きですが、紅茶も飲みます。",
    "「ありがとうございます」と彼女は言った。",
    "コンピューターサイエンスを勉強しています",
    "ｶﾀｶﾅの半角文字も混ざっています。",
    "吾輩は猫である。名前はまだ無い。",
]

KOREAN = [
    "안녕하세요, 만나서 반갑습니다.",
    "오늘 날씨가 정말 좋네요!",
    "한국어 형태소 분석은 어렵습니다.",
    "서울은 대한민국의 수도입니다.",
    "저는 매일 아침 커피를 마셔요.",
    "이 모델은 12억 개의 매개변수를 가지고 있습니다.",
]

ARABIC = [
    "مرحبا بكم في عالم الذكاء الاصطناعي.",
    "اللغة العربية جميلة وغنية بالمفردات.",
    "ذهبت إلى السوق يوم الأحد واشتريت خبزا.",
    "كم عمرك؟ عمري ٢٥ سنة.",
    "بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ",
    "هذا النص مكتوب من اليمين إلى اليسار، مع كلمة English في الوسط.",
]

HINDI = [
    "नमस्ते, आप कैसे हैं?",
    "भारत एक विशाल और विविधतापूर्ण देश है।",
    "मुझे हिंदी में लिखना पसंद है।",
    "कृत्रिम बुद्धिमत्ता का भविष्य उज्ज्वल है।",
    "दिल्ली में आज तापमान ४२ डिग्री था।",
    "क्षत्रिय, ज्ञान, श्रृंगार और द्वार जैसे संयुक्ताक्षर।",
]

OTHER_SCRIPTS = [
    "Привет, как дела? Всё хорошо.",
    "Γειά σου κόσμε! Η γλώσσα είναι όμορφη.",
    "שלום עולם, מה שלומך?",
    "สวัสดีครับ ยินดีต้อนรับ",
    "Xin chào, tôi là người Việt Nam.",
    "Türkçe karakterler: ğ, ş, ı, İ, ö, ç.",
    "Zażółć gęślą jaźń.",
    "ሰላም ለዓለም",
    "ᐊᐃᓐᓇᐅᔪᖅ",
    "ꦲꦤꦕꦫꦏ",
]

EMOJI = ["😀", "🙂", "🚀", "🔥", "👍", "👍🏽", "🎉", "❤️", "✔️", "🇺🇸", "🇯🇵", "🏳️‍🌈", "🏴‍☠️",
         "👩‍💻", "👨‍👩‍👧‍👦", "👩🏾‍🤝‍👩🏻", "🧑‍🚀", "1️⃣", "#️⃣", "🫠", "🥲", "☕", "⌚", "🐈‍⬛",
         "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "👁️‍🗨️", "🧔🏻‍♂️", "🤷‍♀️", "💁🏿‍♂️", "🏃‍➡️"]

COMBINING_BASES = "aeiounAEIOUxyzqkhw"

SPECIAL_TOKENS = [
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>",
    "<|EOT|>", "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁sep｜>",
]

# Spellings that are NOT added tokens but look like them.
NEAR_MISS_TOKENS = [
    "<｜User|>", "<|User|>", "<｜user｜>", "<｜Use", "｜>", "<｜place▁holder▁no▁800｜>",
    "<｜place▁holder▁no▁-1｜>", "<｜begin_of_sentence｜>", "<|EOT|", "<||EOT|>", "<think>", "</think>",
    "<｜begin▁of▁sentence｜", "<<｜User｜>>", "<｜｜>", "<|eot|>",
]

WHITESPACE_CHARS = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\t\t", "\u00a0", "\u3000", "\u2028",
                    "\u2029", "\u0085", "\u000b", "\u000c", "\u2003", "\u202f", "\u200b", "\ufeff", "\u1680"]

PUNCTUATION_RUNS = ["!!!", "???", "?!?!", "...", "…", "---", "—", "–", "***", "###", "==>", "<=>", "!=", ":::",
                    "«", "»", "„", "“", "”", "‘", "’", "「", "」", "『", "』", "【", "】", "、", "。", "，", "！",
                    "¿", "¡", "§", "¶", "•", "·", "©", "®", "™", "°", "±", "×", "÷", "€", "£", "¥", "$", "₹",
                    "(", ")", "[", "]", "{", "}", "<", ">", "/", "\\", "|", "~", "`", "^", "_", "@", "&", "%",
                    "'", '"', ";", ":", ",", ".", "-", "+", "=", "*", "#", "?!", ")]}", "([{", "'s", "\"'"]

DIGIT_SCRIPTS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳۴۵۶۷۸۹", "०१२३४५६७८९", "０１２３４５６７８９",
                 "²³¹", "½¼¾", "ⅠⅡⅢⅫ", "①②③", "๐๑๒"]

# Code point ranges the fuzz category samples (no surrogates, no unassigned
# planes): Latin, symbols, CJK, Hangul, scripts with marks, emoji, astral.
FUZZ_RANGES = [(0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
               (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x2190, 0x23FF),
               (0x2500, 0x27BF), (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF),
               (0x1F300, 0x1F6FF), (0x1F900, 0x1F9FF), (0x20000, 0x2A6DF), (0xE000, 0xE0FF), (0x0, 0x1F)]


def pick(rng, items, k):
    return [rng.choice(items) for _ in range(k)]


def english(rng):
    s = " ".join(pick(rng, ENGLISH, rng.randint(1, 6)))
    style = rng.random()
    if style < 0.1:
        s = s.lower()
    elif style < 0.15:
        s = s.upper()
    elif style < 0.3:
        s = s.replace(". ", ".\n\n")
    return s


def code(rng):
    parts = pick(rng, CODE, rng.randint(1, 3))
    s = "\n".join(parts)
    style = rng.random()
    if style < 0.2:
        s = s.replace("    ", "\t")
    elif style < 0.3:
        s = s.replace("\n", "\r\n")
    elif style < 0.4:
        s = "\n".join("  " + line for line in s.split("\n"))
    return s


def cjk_and_world(rng):
    pools = [CHINESE, JAPANESE, KOREAN, ARABIC, HINDI, OTHER_SCRIPTS]
    weights = [4, 3, 2, 2, 2, 2]
    pool = rng.choices(pools, weights)[0]
    parts = pick(rng, pool, rng.randint(1, 5))
    if rng.random() < 0.3:
        parts.insert(rng.randrange(len(parts) + 1), rng.choice(ENGLISH))
    if rng.random() < 0.2:
        parts.insert(rng.randrange(len(parts) + 1), str(rng.randint(0, 10 ** rng.randint(1, 9))))
    sep = rng.choice(["", "", " ", "\n", "，"])
    return sep.join(parts)


def emoji(rng):
    out = []
    for _ in range(rng.randint(1, 12)):
        r = rng.random()
        if r < 0.5:
            out.append(rng.choice(EMOJI))
        elif r < 0.7:
            out.append(rng.choice(ENGLISH).split(" ")[0])
        elif r < 0.85:
            out.append(" ")
        else:
            # A ZWJ or variation selector in an unusual place.
            out.append(rng.choice(["\u200d", "\ufe0f", "\ufe0e", "\u200d\u200d", "\U0001F3FB"]))
    return "".join(out)


def combining(rng):
    out = []
    for _ in range(rng.randint(1, 15)):
        r = rng.random()
        if r < 0.6:
            base = rng.choice(COMBINING_BASES)
            marks = "".join(chr(rng.randint(0x300, 0x36F)) for _ in range(rng.randint(1, 4)))
            out.append(base + marks)
        elif r < 0.75:
            out.append(rng.choice(["e\u0301", "n\u0303", "a\u030a", "\u0915\u094d\u0937", "\u0627\u064e",
                                   "\u1100\u1161\u11a8", "o\u0308\u0304", "\u05e9\u05c1"]))
        elif r < 0.85:
            out.append(chr(rng.randint(0x300, 0x36F)))  # a mark with no base
        else:
            out.append(rng.choice([" ", "", "\n", "-"]))
    return "".join(out)


def digits(rng):
    r = rng.random()
    if r < 0.3:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 400)))
    if r < 0.5:
        sep = rng.choice([",", ".", " ", "_", "'", ""])
        groups = ["%03d" % rng.randint(0, 999) for _ in range(rng.randint(1, 12))]
        return str(rng.randint(1, 999)) + sep + sep.join(groups)
    if r < 0.7:
        s = rng.choice(DIGIT_SCRIPTS)
        return "".join(rng.choice(s) for _ in range(rng.randint(1, 40)))
    if r < 0.85:
        return " ".join(str(rng.randint(0, 10 ** rng.randint(0, 12))) for _ in range(rng.randint(1, 20)))
    return "x%d.%de-%d, pi=3.14159265358979323846, v%d.%d.%d" % (
        rng.randint(0, 99), rng.randint(0, 999), rng.randint(1, 30), rng.randint(0, 9), rng.randint(0, 99),
        rng.randint(0, 999))


def whitespace(rng):
    out = []
    for _ in range(rng.randint(1, 14)):
        r = rng.random()
        if r < 0.45:
            out.append("".join(pick(rng, WHITESPACE_CHARS, rng.randint(1, 6))))
        elif r < 0.6:
            out.append(" " * rng.randint(1, 40))
        elif r < 0.8:
            out.append(rng.choice(ENGLISH).split(" ")[rng.randint(0, 3)])
        else:
            out.append(rng.choice(["hello", "世界", "123", "!", "x", "_", "a.b", "안녕", "\u00e9"]))
    s = "".join(out)
    if rng.random() < 0.3:
        s = " " * rng.randint(1, 8) + s
    if rng.random() < 0.3:
        s = s + rng.choice([" ", "   ", "\n", "\t", " \n ", "\r\n\r\n"])
    return s


def punctuation(rng):
    out = []
    for _ in range(rng.randint(1, 20)):
        r = rng.random()
        if r < 0.6:
            out.append(rng.choice(PUNCTUATION_RUNS) * rng.randint(1, 4))
        elif r < 0.8:
            out.append(rng.choice(["word", "A", "zz", "中", "7", "Éa", "x1"]))
        else:
            out.append(rng.choice([" ", "\n", "", "\t"]))
    return "".join(out)


def special_tokens(rng):
    out = []
    for _ in range(rng.randint(1, 10)):
        r = rng.random()
        if r < 0.3:
            out.append(rng.choice(SPECIAL_TOKENS))
        elif r < 0.45:
            out.append("<｜place▁holder▁no▁%d｜>" % rng.randint(0, 799))
        elif r < 0.6:
            out.append(rng.choice(NEAR_MISS_TOKENS))
        elif r < 0.85:
            out.append(rng.choice(ENGLISH + CHINESE + ["x", "<", "｜", "▁", "{\"a\": 1}"]))
        else:
            out.append(rng.choice([" ", "\n", "  ", "\t"]))
    return "".join(out)


def fuzz(rng):
    out = []
    for _ in range(rng.randint(1, 60)):
        lo, hi = rng.choice(FUZZ_RANGES)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def mixed(rng):
    generators = [english, code, cjk_and_world, emoji, combining, digits, whitespace, punctuation, special_tokens]
    return rng.choice(["\n", "\n\n", " ", ""]).join(rng.choice(generators)(rng) for _ in range(rng.randint(2, 6)))


def very_long(rng, kind, size):
    pieces = []
    total = 0
    while total < size:
        if kind == "english":
            p = english(rng) + rng.choice([" ", "\n"])
        elif kind == "chinese":
            # Hanzi with no punctuation: one pre-tokenizer piece tens of KB long.
            p = "".join(rng.choice(CHINESE).rstrip("。！？") for _ in range(3)).replace("，", "").replace("：", "")
            p = "".join(c for c in p if "\u4e00" <= c <= "\u9fa5")
        elif kind == "code":
            p = code(rng) + "\n"
        elif kind == "whitespace":
            p = " " * rng.randint(1000, 5000) + rng.choice(["x", "\n", "\t", "1", "中"])
        elif kind == "digits":
            p = "".join(rng.choice("0123456789") for _ in range(2000)) + rng.choice([" ", "a", ""])
        else:
            p = mixed(rng)
        pieces.append(p)
        total += len(p.encode("utf-8"))
    return "".join(pieces)


# (generator, count) of the golden corpus; 3000+ short strings in all.
GOLDEN_PLAN = [(english, 400), (code, 400), (cjk_and_world, 650), (emoji, 150), (combining, 150), (digits, 150),
               (whitespace, 300), (punctuation, 150), (special_tokens, 250), (fuzz, 300), (mixed, 200)]

# Edge cases written out by hand.
FIXED = ["", " ", "  ", "\n", "\r\n", "\t", "a", "A", "0", "00", "000", "0000", "12345", " 123", "a1b22c333d4444",
         "hello", " hello", "  hello", "hello ", "hello  ", "hello\n", "hello\n\n", " \n hello", "\u0085", "a\u0085b",
         "x \u0085 y", "\u00a0hello", "\u3000世界", "Ġ", "ĠĠ", "Ċ", "<", "<｜", "<｜User｜>", "<｜User｜><｜User｜>",
         "<｜User｜>\n", " <｜User｜> ", "a<｜User｜>b", "<|EOT|><|EOT|>", "<<|EOT|>>", "\x00", "a\x00b",
         "\ufffd", "\U0010fffd", "\U0001F600" * 5, "’s", "'s", "'S", "'ll", "I'm", "don’t", "!!!a", "!a", "?Abc",
         "#include", "@decorator", "$var", "...and", "(x)", "—dash", "«quote»", "\n\n\n\n", "\t\t\t", "  \t  \n  ",
         "end   ", "ABCdef", "ǅ", "ǈǋ", "ßẞ", "İı", "ﬁ", "Ⅻ", "½", "²", "一二三", "一1二2三3", "ぁゔ", "ァヺ", "ｱｲｳ"]


def golden_corpus():
    rng = random.Random(20250315)
    corpus = list(FIXED)
    for generator, count in GOLDEN_PLAN:
        corpus.extend(generator(rng) for _ in range(count))
    for kind, size in [("english", 100_000), ("chinese", 60_000), ("code", 80_000), ("whitespace", 50_000),
                       ("digits", 50_000), ("mixed", 60_000)]:
        corpus.append(very_long(rng, kind, size))
    return corpus


def bench_corpus(megabytes):
    """Mixed documents of 1-20 KB, about `megabytes` MB in all (UTF-8)."""
    rng = random.Random(777)
    generators = [english, code, cjk_and_world, emoji, combining, digits, whitespace, punctuation, special_tokens,
                  fuzz]
    # Mostly prose and code, as in real traffic; a share of everything else.
    weights = [30, 25, 20, 3, 2, 4, 5, 3, 3, 5]
    docs, total = [], 0
    while total < megabytes * 1_000_000:
        target = rng.randint(1_000, 20_000)
        parts, size = [], 0
        while size < target:
            p = rng.choices(generators, weights)[0](rng)
            parts.append(p)
            size += len(p.encode("utf-8")) + 1
        doc = "\n".join(parts)
        docs.append(doc)
        total += len(doc.encode("utf-8"))
    return docs


def write_jsonl(strings, path):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for s in strings:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")


def read_jsonl(path):
    with open(path, encoding="utf-8", newline="\n") as f:
        return [json.loads(line) for line in f.read().split("\n") if line]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["golden", "bench"])
    parser.add_argument("out")
    parser.add_argument("--megabytes", type=float, default=10.0, help="size of the bench corpus")
    args = parser.parse_args()
    strings = golden_corpus() if args.which == "golden" else bench_corpus(args.megabytes)
    write_jsonl(strings, args.out)
    size = sum(len(s.encode("utf-8")) for s in strings)
    print(f"{args.out}: {len(strings)} strings, {size / 1e6:.2f} MB", file=sys.stderr)


if __name__ == "__main__":
    main()
