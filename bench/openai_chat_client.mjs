// bench/openai_chat_client.mjs — the official `openai` npm client's chat.completions.create
// against a `dissect serve` already running on this machine: one request not streamed and the
// same one streamed, at temperature 0, their contents and finish_reasons compared (issue 48
// item 2). Loopback only (127.0.0.1, fixed), two requests, 60 s each, no retries.
//
//   npm install --prefix /tmp/oai openai                 # once, outside the repository
//   dissect serve build/dev/tests/tools/chat-llama --port 8080 &
//   node bench/openai_chat_client.mjs --port 8080 --prefix /tmp/oai
//
// Exit status 0 when the streamed content equals the non-streamed one, 1 otherwise.
import { createRequire } from "node:module";
import path from "node:path";

const args = { port: null, prefix: "/tmp/oai" };
for (let i = 2; i < process.argv.length; i += 2) {
  const [flag, value] = [process.argv[i], process.argv[i + 1]];
  if (flag === "--port") args.port = Number(value);
  else if (flag === "--prefix") args.prefix = path.resolve(value);
  else throw new Error(`unknown flag ${flag}; usage: --port PORT [--prefix DIR]`);
}
if (!Number.isInteger(args.port) || args.port <= 0 || args.port > 65535)
  throw new Error("--port: a port in [1, 65535] is required");
const require = createRequire(path.join(args.prefix, "node_modules", "_"));
const { default: OpenAI } = await import(require.resolve("openai"));

const client = new OpenAI({
  baseURL: `http://127.0.0.1:${args.port}/v1`, apiKey: "unused", timeout: 60_000, maxRetries: 0,
});
const request = {
  model: "served",
  messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi there" }],
  temperature: 0,
  max_tokens: 12,
};
const whole = await client.chat.completions.create(request);
console.log("not streamed:", JSON.stringify(whole.choices[0]), JSON.stringify(whole.usage));
let content = "", chunks = 0, finish = null, role = null;
for await (const chunk of await client.chat.completions.create({ ...request, stream: true })) {
  chunks++;
  const choice = chunk.choices[0];
  if (choice?.delta?.role) role = choice.delta.role;
  if (choice?.delta?.content) content += choice.delta.content;
  if (choice?.finish_reason) finish = choice.finish_reason;
}
console.log(`streamed: ${chunks} chunks, role ${role}, content ${JSON.stringify(content)}, ` +
            `finish_reason ${finish}`);
const same = content === whole.choices[0].message.content &&
             finish === whole.choices[0].finish_reason;
console.log(same ? "OK: the streamed reply equals the one not streamed" : "MISMATCH");
process.exit(same ? 0 : 1);
