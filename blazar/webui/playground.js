// Playground: chat with any served model (and `model+adapter` variants) through
// /v1/chat/completions, streamed, with the engine's timings (and speculative decoding's
// draft counts when the engine reports them); speech: upload or record a clip to
// transcribe (/v1/audio/transcriptions), type text to speak (/v1/audio/speech); images:
// a prompt, a size, steps and a seed to draw with an image model (/v1/images/generations).

import { call, events } from "./api.js";
import { el, clear, ms } from "./util.js";

export const id = "playground";
export const title = "Playground";

let root, ctx, chatModel, speechModels, imageModels, log, input, system, maxTokens, sendButton, timings;
let history = [];
let controller = null;

export function mount(node, context) {
  root = node;
  ctx = context;
  chatModel = el("select", { id: "chat-model", "aria-label": "model" });
  system = el("textarea", { id: "chat-system", rows: 2, placeholder: "system prompt (optional)" });
  maxTokens = el("input", { id: "chat-max", type: "number", min: 1, value: "128", "aria-label": "max tokens" });
  log = el("div", { class: "chatlog", id: "chat-log" });
  input = el("textarea", { id: "chat-input", rows: 3, placeholder: "Say something; Enter sends, Shift+Enter is a new line" });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); send(); }
  });
  sendButton = el("button", { id: "chat-send", text: "Send", onclick: send });
  timings = el("div", { class: "timings", id: "chat-timings" });
  const chat = el("div", { class: "card" },
    el("div", { class: "row" }, el("label", {}, "model ", chatModel), el("label", {}, "max tokens ", maxTokens),
      el("span", { class: "spacer" }),
      el("button", { class: "small", text: "new chat", onclick: () => { history = []; clear(log); clear(timings); } })),
    system, log, input,
    el("div", { class: "row" }, sendButton,
      el("button", { class: "small", text: "stop", onclick: () => controller && controller.abort() }), timings));
  speechModels = el("div", { class: "card speech" });
  imageModels = el("div", { class: "card images", id: "image-card" });
  root.append(el("h2", { text: "Playground" }), chat, speechModels, imageModels);
  ctx.on("models", fill);
  fill();
}

function fill() {
  const models = ctx.state.models.filter((m) => m.served);
  const names = [];
  for (const m of models.filter((m) => m.kind === "chat" && m.can_chat !== false)) {
    names.push(m.name, ...(m.variants || []));
  }
  const current = chatModel.value;
  if (names.join("\n") !== [...chatModel.options].map((o) => o.value).join("\n")) {
    clear(chatModel).append(...names.map((n) => el("option", { value: n, text: n })));
    if (names.includes(current)) chatModel.value = current;
  }
  speech(models);
  images(models);
}

function bubble(role, text = "") {
  const node = el("div", { class: `msg ${role}` }, el("span", { class: "role", text: role }), el("span", { class: "text", text }));
  log.append(node);
  log.scrollTop = log.scrollHeight;
  return node.querySelector(".text");
}

function showTimings(started, first, usage, engine) {
  const parts = [`first token ${first ? ms(first - started) : "-"}`, `total ${ms(performance.now() - started)}`];
  if (usage) parts.push(`${usage.prompt_tokens} prompt / ${usage.completion_tokens} generated tokens`);
  if (engine) {
    if (engine.prompt_ms !== undefined) parts.push(`prompt ${ms(engine.prompt_ms)}`);
    if (engine.predicted_per_second) parts.push(`${engine.predicted_per_second.toFixed(1)} tokens/s`);
    if (engine.cache_n !== undefined) parts.push(`${engine.cache_n} cached`);
    parts.push(engine.draft_n ? `speculative: ${engine.draft_n_accepted}/${engine.draft_n} drafts accepted` : "speculative: off");
  }
  timings.textContent = parts.join(" · ");
}

async function send() {
  const text = input.value.trim();
  if (!text || !chatModel.value || controller) return;
  input.value = "";
  history.push({ role: "user", content: text });
  bubble("user", text);
  const out = bubble("assistant");
  out.parentElement.classList.add("streaming");
  const messages = system.value.trim() ? [{ role: "system", content: system.value.trim() }, ...history] : history;
  const body = { model: chatModel.value, messages, stream: true, stream_options: { include_usage: true },
    max_tokens: Number(maxTokens.value) || 128 };
  controller = new AbortController();
  sendButton.disabled = true;
  const started = performance.now();
  let first = null, usage = null, engine = null, answer = "";
  try {
    const resp = await call("POST", "/v1/chat/completions", { json: body, signal: controller.signal });
    for await (const { data } of events(resp)) {
      if (data === "[DONE]" || typeof data !== "object") continue;
      if (data.error) throw new Error(data.error.message || JSON.stringify(data.error));
      const delta = data.choices && data.choices[0] && data.choices[0].delta;
      const piece = delta && (delta.content || delta.reasoning_content);
      if (piece) {
        if (first === null) first = performance.now();
        answer += piece;
        out.textContent = answer;
        log.scrollTop = log.scrollHeight;
      }
      if (data.usage) usage = data.usage;
      if (data.timings) engine = data.timings;
      showTimings(started, first, usage, engine);
    }
    history.push({ role: "assistant", content: answer });
  } catch (error) {
    if (error.name !== "AbortError") out.parentElement.append(el("p", { class: "problem", text: error.message }));
    history.pop();
  } finally {
    out.parentElement.classList.remove("streaming");
    out.parentElement.classList.add("done");
    showTimings(started, first, usage, engine);
    controller = null;
    sendButton.disabled = false;
  }
}

// -- speech --------------------------------------------------------------------------------

function speech(models) {
  const heard = models.filter((m) => m.kind === "transcription").map((m) => m.name);
  const voices = models.filter((m) => m.kind === "speech").map((m) => m.name);
  const key = `${heard.join(",")}|${voices.join(",")}`;
  if (speechModels.dataset.key === key) return;
  speechModels.dataset.key = key;
  clear(speechModels).append(el("h3", { text: "Speech" }));
  if (!heard.length && !voices.length) {
    speechModels.append(el("p", { class: "empty", text: "No transcription model or voice is served (docs/audio.md declares them)." }));
    return;
  }
  if (heard.length) speechModels.append(transcriber(heard));
  if (voices.length) speechModels.append(speaker(voices));
}

function options(names) { return names.map((n) => el("option", { value: n, text: n })); }

function transcriber(names) {
  const model = el("select", { "aria-label": "transcription model" }, options(names));
  const file = el("input", { type: "file", accept: "audio/*", "aria-label": "audio file" });
  const result = el("pre", { class: "transcript" });
  const upload = async (blob, name) => {
    const form = new FormData();
    form.append("model", model.value);
    form.append("file", blob, name);
    result.textContent = "transcribing…";
    try {
      const resp = await call("POST", "/v1/audio/transcriptions", { body: form });
      result.textContent = (await resp.json()).text;
    } catch (error) { result.textContent = error.message; }
  };
  let recorder = null;
  const record = el("button", { class: "small", text: "record", onclick: async () => {
    if (recorder) { recorder.stop(); return; }
    try {
      const media = await navigator.mediaDevices.getUserMedia({ audio: true });
      const chunks = [];
      recorder = new MediaRecorder(media);
      recorder.ondataavailable = (e) => chunks.push(e.data);
      recorder.onstop = () => {
        media.getTracks().forEach((t) => t.stop());
        record.textContent = "record";
        recorder = null;
        upload(new Blob(chunks, { type: chunks[0] ? chunks[0].type : "audio/webm" }), "recording.webm");
      };
      recorder.start();
      record.textContent = "stop and transcribe";
    } catch (error) { result.textContent = `no microphone: ${error.message}`; }
  } });
  return el("div", { class: "row wrap" }, el("b", { text: "Transcribe " }), model, file,
    el("button", { class: "small", text: "upload", onclick: () => file.files[0] && upload(file.files[0], file.files[0].name) }),
    record, result);
}

function speaker(names) {
  const model = el("select", { "aria-label": "voice" }, options(names));
  const text = el("input", { type: "text", placeholder: "text to speak", "aria-label": "text to speak" });
  const audio = el("audio", { controls: true });
  const speak = async () => {
    if (!text.value.trim()) return;
    try {
      const resp = await call("POST", "/v1/audio/speech", { json: { model: model.value, input: text.value, response_format: "wav" } });
      if (audio.src) URL.revokeObjectURL(audio.src);
      audio.src = URL.createObjectURL(await resp.blob());
      audio.play().catch(() => {});
    } catch (error) { ctx.toast(error.message, "error"); }
  };
  return el("div", { class: "row wrap" }, el("b", { text: "Speak " }), model, text,
    el("button", { class: "small", text: "speak", onclick: speak }), audio);
}

// -- images --------------------------------------------------------------------------------

function images(models) {
  const names = models.filter((m) => m.kind === "image").map((m) => m.name);
  const key = names.join(",");
  if (imageModels.dataset.key === key) return;
  imageModels.dataset.key = key;
  clear(imageModels).append(el("h3", { text: "Images" }));
  if (!names.length) {
    imageModels.append(el("p", { class: "empty", text: "No image model is served (docs/engines.md, the sdcpp lane, declares one)." }));
    return;
  }
  imageModels.append(painter(names));
}

function painter(names) {
  const model = el("select", { id: "image-model", "aria-label": "image model" }, options(names));
  const prompt = el("input", { id: "image-prompt", type: "text", placeholder: "a picture of…", "aria-label": "image prompt" });
  const size = el("select", { id: "image-size", "aria-label": "size" },
    options(["64x64", "128x128", "256x256", "512x512", "768x768", "1024x1024"]));
  size.value = "256x256";
  const steps = el("input", { id: "image-steps", type: "number", min: 1, value: "4", "aria-label": "steps" });
  const seed = el("input", { id: "image-seed", type: "number", min: 0, placeholder: "random", "aria-label": "seed" });
  const picture = el("img", { id: "image-result", alt: "" });
  const status = el("span", { class: "timings", id: "image-status" });
  const draw = async () => {
    if (!prompt.value.trim()) return;
    const body = { model: model.value, prompt: prompt.value, size: size.value, steps: Number(steps.value) || undefined };
    if (seed.value !== "") body.seed = Number(seed.value);
    status.textContent = "drawing…";
    const started = performance.now();
    try {
      const resp = await call("POST", "/v1/images/generations", { json: body });
      const answer = await resp.json();
      picture.src = `data:image/png;base64,${answer.data[0].b64_json}`;
      picture.alt = prompt.value;
      status.textContent = `${size.value}, ${body.steps || "default"} steps in ${ms(performance.now() - started)}`;
    } catch (error) { status.textContent = ""; ctx.toast(error.message, "error"); }
  };
  prompt.addEventListener("keydown", (event) => { if (event.key === "Enter") draw(); });
  return el("div", {},
    el("div", { class: "row wrap" }, el("b", { text: "Draw " }), model, prompt,
      el("label", {}, "size ", size), el("label", {}, "steps ", steps), el("label", {}, "seed ", seed),
      el("button", { class: "small", id: "image-draw", text: "draw", onclick: draw }), status),
    picture);
}
