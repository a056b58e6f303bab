// llama_driver.mjs — loads llama.cpp for the generator scripts here: node-llama-cpp from
// $LLAMA_PACKAGES/node_modules (LLAMA_PACKAGES defaults to <repo>/.deps/llama, where
// make_fixtures.sh installs it), its prebuilt CPU libraries, never a local build.
import fs from "node:fs";
import path from "node:path";
import {fileURLToPath, pathToFileURL} from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));

/** {llama, description}: node-llama-cpp's Llama object, and which llama.cpp it runs. */
export async function loadLlama() {
  const packages = process.env.LLAMA_PACKAGES ?? path.resolve(here, "../../../.deps/llama");
  const driverDir = path.join(packages, "node_modules", "node-llama-cpp");
  if (!fs.existsSync(path.join(driverDir, "package.json"))) {
    console.error(`node-llama-cpp is not installed in ${packages} (set LLAMA_PACKAGES)`);
    process.exit(2);
  }
  const {getLlama} = await import(pathToFileURL(path.join(driverDir, "dist", "index.js")).href);
  const version = JSON.parse(fs.readFileSync(path.join(driverDir, "package.json"), "utf8")).version;
  const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
  const {repo, release} = llama.llamaCppRelease;
  return {llama, description: `node-llama-cpp ${version} (${repo} ${release}, ${llama.buildType} binaries)`};
}
