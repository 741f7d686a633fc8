// read.mjs FILE... — each safetensors file read by the npm package
// "safetensors" (not plait's reader): one JSON object per tensor on stdout,
// {"name", "dtype", "shape", "sha256"} of its bytes, for test_hf.sh to
// compare with what the Python side wrote.
import { readFileSync } from "node:fs";
import { createHash } from "node:crypto";
import { SafeTensor } from "safetensors/dist/safetensors.es.js";

for (const path of process.argv.slice(2)) {
  const st = new SafeTensor(new Uint8Array(readFileSync(path)));
  for (const [name, meta] of st.metadata) {
    if (name === "__metadata__") continue;
    const bytes = st.getTensor(name);
    const sha256 = createHash("sha256").update(bytes).digest("hex");
    console.log(JSON.stringify({ name, dtype: meta.dtype, shape: meta.shape, sha256 }));
  }
}
