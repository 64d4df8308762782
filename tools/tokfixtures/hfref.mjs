// Prints the ids that Hugging Face's tokenizers.js (@huggingface/tokenizers)
// gives for a text file: one line of ids per input line ("lines" mode), or
// the whole file as one text ("whole" mode). add_special_tokens is false.
// Usage: node hfref.mjs <tokenizers.js dir> <tokenizer.json> <text> lines|whole
import fs from "fs";
import path from "path";
import { pathToFileURL } from "url";
const [dir, tokJSON, textFile, mode] = process.argv.slice(2);
const { Tokenizer } = await import(pathToFileURL(path.join(dir, "dist/tokenizers.mjs")).href);
const tok = new Tokenizer(JSON.parse(fs.readFileSync(tokJSON, "utf-8")), {});
const text = fs.readFileSync(textFile, "utf-8");
const enc = (s) => tok.encode(s, { add_special_tokens: false }).ids.join(" ");
if (mode === "whole") {
  process.stdout.write(enc(text) + "\n");
} else {
  const lines = text.replace(/\n$/, "").split("\n");
  process.stdout.write(lines.map(enc).join("\n") + "\n");
}
