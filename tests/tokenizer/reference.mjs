// reference.mjs — js-tiktoken (a JavaScript port of tiktoken) for plait's tokenizer tests:
//   node reference.mjs export NAME OUT.tiktoken        the encoding's ranks as a tiktoken file
//   node reference.mjs gpt2-json OUT.json              GPT-2 as a Hugging Face tokenizer.json:
//       vocab and merges made from the ranks (each token's merge is the split its own BPE
//       makes with the ranks below its own, as tiktoken's converters do)
//   node reference.mjs encode NAME TEXT                the ids of TEXT's bytes, one a line
//   node reference.mjs bench NAME TEXT SECONDS         tokens per second of encoding TEXT
import fs from "node:fs";
import { Tiktoken } from "js-tiktoken/lite";

const argv = process.argv.slice(2);
if (argv[0] === "gpt2-json") argv.splice(1, 0, "gpt2");
const [cmd, name, arg, extra] = argv;
const ranks = (await import(`js-tiktoken/ranks/${name}`)).default;

// the ranks file's lines: "! OFFSET TOKEN..." in js-tiktoken's packing
function* entries(r) {
  for (const line of r.bpe_ranks.split("\n").filter(Boolean)) {
    const [, offset, ...tokens] = line.split(" ");
    let i = Number.parseInt(offset, 10);
    for (const t of tokens) yield [t, i++];
  }
}

if (cmd === "export") {
  const out = [];
  for (const [t, rank] of entries(ranks)) out.push(`${t} ${rank}\n`);
  fs.writeFileSync(arg, out.join(""));
} else if (cmd === "gpt2-json") {
  const byteChar = []; // GPT-2's bytes_to_unicode
  let next = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    byteChar[b] = String.fromCodePoint(printable ? b : next++);
  }
  const rankOf = new Map(), tokens = [];
  for (const [t, rank] of entries(ranks)) {
    const bytes = Buffer.from(t, "base64");
    rankOf.set(bytes.toString("latin1"), rank);
    tokens.push([bytes, rank]);
  }
  // the split of `bytes` by BPE with only the ranks below maxRank
  const split = (bytes, maxRank) => {
    let parts = [...bytes].map((b) => Buffer.from([b]).toString("latin1"));
    for (;;) {
      let best = -1, bestRank = maxRank;
      for (let i = 0; i + 1 < parts.length; i++) {
        const r = rankOf.get(parts[i] + parts[i + 1]);
        if (r !== undefined && r < bestRank) [best, bestRank] = [i, r];
      }
      if (best < 0) return parts;
      parts.splice(best, 2, parts[best] + parts[best + 1]);
    }
  };
  const text = (latin1) => [...Buffer.from(latin1, "latin1")].map((b) => byteChar[b]).join("");
  const vocab = {}, merges = [];
  tokens.sort((a, b) => a[1] - b[1]);
  for (const [bytes, rank] of tokens) {
    vocab[text(bytes.toString("latin1"))] = rank;
    if (bytes.length < 2) continue;
    const parts = split(bytes, rank);
    if (parts.length !== 2) throw new Error(`token ${rank} does not split in two`);
    merges.push(`${text(parts[0])} ${text(parts[1])}`);
  }
  const added = Object.entries(ranks.special_tokens).map(([content, id]) => ({
    id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
  }));
  fs.writeFileSync(arg, JSON.stringify({
    version: "1.0", truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: null, decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "",
             end_of_word_suffix: "", fuse_unk: false, vocab, merges },
  }));
} else if (cmd === "encode") {
  const enc = new Tiktoken(ranks);
  const ids = enc.encode(fs.readFileSync(arg, "utf8"), [], []);
  process.stdout.write(ids.join("\n") + "\n");
} else if (cmd === "bench") {
  const enc = new Tiktoken(ranks), text = fs.readFileSync(arg, "utf8");
  let tokens = 0, t0 = performance.now(), t = t0;
  enc.encode(text.slice(0, 1000), [], []); // warm
  t0 = performance.now();
  while ((t = performance.now()) - t0 < Number(extra) * 1000) tokens += enc.encode(text, [], []).length;
  console.log(JSON.stringify({ tokens, seconds: (t - t0) / 1000 }));
} else {
  console.error("usage: node reference.mjs export|gpt2-json|encode|bench ...");
  process.exit(2);
}
