// Command tokfixtures writes the deterministic multilingual corpus that the
// tokenizer package's equality tests run on (English, code, Chinese,
// Japanese, Korean, Russian, Arabic, Hindi, Greek, emoji, whitespace runs,
// numbers, contractions).
//
// Usage:
//
//	go run ./tools/tokfixtures -bytes 200000 -seed 1 > corpus.txt
//
// generate.sh in this directory runs it and then the reference encoders
// (node gpt-3-encoder, spm_train/spm_encode) to refresh
// tokenizer/testdata.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
)

var pools = [][]string{
	{ // English with contractions
		"The quick brown fox jumps over the lazy dog.",
		"I'm sure you'll find it's not what they'd expected, but we've tried.",
		"DON'T PANIC: it's only a test, and I'LL be back.",
		"She said, \"Tokenizers aren't magic—they're just greedy merges.\"",
		"Megatron-LM trains models with tensor, pipeline and data parallelism.",
		"It’s a curly apostrophe; that's a straight one. Isn't it?",
		"Rock 'n' roll, o'clock, y'all, ma'am and 'tis the season.",
		"Numbers like 3.14159, 2,718,281 and 1e-9 appear in papers from 2023.",
		"Café, naïve, résumé, jalapeño, Zürich and Ångström keep their accents.",
		"E-mail me at someone@example.com or visit https://example.org/path?q=1&x=2.",
	},
	{ // Chinese
		"深度学习模型需要大量的数据和计算资源。",
		"我们使用张量并行和流水线并行来训练大型语言模型。",
		"今天天气很好，我们去公园散步吧！",
		"这个分词器必须与参考实现完全一致，每一个编号都不能错。",
		"中文没有空格，所以预分词会把整句话当作一个片段。",
	},
	{ // Japanese
		"東京は日本の首都です。人口は約1400万人です。",
		"ひらがなとカタカナと漢字を混ぜて書きます。",
		"トークナイザーのテストを書いています。よろしくお願いします！",
		"吾輩は猫である。名前はまだ無い。",
	},
	{ // Korean
		"안녕하세요, 만나서 반갑습니다.",
		"언어 모델은 다음 토큰을 예측합니다.",
	},
	{ // Russian
		"Съешь же ещё этих мягких французских булок, да выпей чаю.",
		"Модель обучается на больших корпусах текста на разных языках.",
		"В 2024 году было опубликовано 1 234 статьи о трансформерах.",
		"«Ёлки-палки», — сказал он и улыбнулся.",
	},
	{ // Arabic
		"اللغة العربية تكتب من اليمين إلى اليسار.",
		"نماذج اللغة الكبيرة تتعلم من النصوص الكثيرة.",
		"العدد ١٢٣ مكتوب بالأرقام العربية الهندية.",
	},
	{ // Hindi, Greek, Thai, Hebrew
		"हिन्दी भाषा देवनागरी लिपि में लिखी जाती है।",
		"Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
		"ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
		"עברית נכתבת מימין לשמאל.",
	},
	{ // decomposed and compatibility characters (normalizers differ here)
		"Cafe\u0301 na\u0131\u0308ve A\u030angstro\u0308m, Zu\u0308rich.",
		"Ligatures ﬁ ﬂ ﬀ, superscripts x² y³, circled ① ② ③, fullwidth ＡＢＣ １２３.",
		"Halfwidth ｶﾀｶﾅ and compatibility ㎏ ㎞ ℃ ™ Ⅻ.",
		"Tiếng Việt có dấu: Việt Nam, Hà Nội, thành phố Hồ Chí Minh.",
		"İstanbul, Iğdır, ŞEHİR; Ǆ ǅ ǆ; ΣΊΣΥΦΟΣ.",
	},
	{ // emoji and symbols
		"Great job! 🎉🎉🎉 👍🏽 ❤️ 👨‍👩‍👧‍👦 🇯🇵 🇫🇷",
		"Math: ∑ᵢ xᵢ² ≤ ∞, α+β=γ, √2 ≈ 1.414, ½ ¾ ⅓.",
		"Arrows → ← ↑ ↓ ⇒ and boxes ┌─┐ └─┘ ░▒▓█.",
		"Currency: $100, €85.50, £70, ¥10000, ₹500, ₿0.001.",
	},
}

var code = []string{
	"func (t *GPT2) Encode(text string) []int {\n\treturn t.bpe.encode(text)\n}\n",
	"for i := 0; i < len(s); i++ {\n\t\tif s[i] == ' ' {\n\t\t\tcontinue\n\t\t}\n\t}\n",
	"def forward(self, x):\n    # (B, T, C)\n    return self.proj(F.gelu(self.fc(x)))\n",
	"{\"name\": \"gotron\", \"layers\": 24, \"hidden\": 1024, \"heads\": 16, \"dropout\": 0.1}\n",
	"if (x != NULL && x->next) { x = x->next; } // walk the list\n",
	"SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;\n",
	"    assert tokens == [464, 2068, 7586, 21831], f\"got {tokens!r}\"\n",
	"<div class=\"row\"><span>&nbsp;&lt;tag&gt;</span></div>\n",
}

var spaces = []string{" ", "  ", "   ", "    ", "\t", "\t\t", " \t ", "\n", "\n\n", "\n\n\n", "  \n", " \n \n", "        "}

func main() {
	size := flag.Int("bytes", 200000, "approximate corpus size in bytes")
	seed := flag.Uint64("seed", 1, "random seed")
	flag.Parse()
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	if err := write(w, *size, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "tokfixtures:", err)
		os.Exit(1)
	}
}

// write emits lines of mixed material until size bytes are written.
func write(w *bufio.Writer, size int, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 0x70c))
	n := 0
	for n < size {
		var b strings.Builder
		for k := 1 + rng.IntN(4); k > 0; k-- {
			switch r := rng.IntN(10); {
			case r < 6:
				p := pools[rng.IntN(len(pools))]
				b.WriteString(p[rng.IntN(len(p))])
			case r < 7:
				b.WriteString(code[rng.IntN(len(code))])
			case r < 8:
				fmt.Fprintf(&b, "%d", rng.Int64N(1_000_000_000))
			case r < 9:
				fmt.Fprintf(&b, "%.*f", rng.IntN(5), rng.Float64()*1000)
			default:
				b.WriteString(spaces[rng.IntN(len(spaces))])
			}
			if rng.IntN(3) > 0 {
				b.WriteByte(' ')
			}
		}
		line := strings.TrimRight(b.String(), "\n")
		if _, err := w.WriteString(line + "\n"); err != nil {
			return err
		}
		n += len(line) + 1
	}
	return nil
}
