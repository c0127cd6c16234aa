// The IDG page: no build step, no external assets. Streams /attribute/stream and draws the curve.
"use strict";
const $ = (id) => document.getElementById(id);
// the checkout's own freely licensed photos (samples/README.md says where each comes from), as thumbnails
const SAMPLES = ["coffee.jpg", "cat.jpg", "rocket.jpg", "astronaut.jpg"];
let chosen = null; // {blob, name}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

// The API key (when the service has IDG_API_KEY set): asked for on the first 401, kept in
// sessionStorage (this tab only, gone when it closes) and sent as X-API-Key on every API call.
const KEY_STORE = "idg-api-key";
let keyWanted = null; // the promise every call waiting on a 401 shares, until a key is entered

function askForKey(message) {
  $("auth-message").textContent = message;
  $("auth").hidden = false;
  $("api-key").value = "";
  $("api-key").focus();
  if (!keyWanted) {
    keyWanted = new Promise((resolve) => {
      const submit = (e) => {
        e.preventDefault();
        const key = $("api-key").value.trim();
        if (!/^[\x20-\x7e]+$/.test(key)) { // what an HTTP header can carry
          $("auth-message").textContent = "An API key is printable ASCII text: check what was pasted.";
          return;
        }
        $("auth").removeEventListener("submit", submit);
        sessionStorage.setItem(KEY_STORE, key);
        $("auth").hidden = true;
        keyWanted = null;
        resolve();
      };
      $("auth").addEventListener("submit", submit);
    });
  }
  return keyWanted;
}

// fetch with the stored key; on 401 ask for a key (saying "wrong key" when one was refused) and retry
async function api(url, options = {}, onAsk = () => {}) {
  for (;;) {
    const key = sessionStorage.getItem(KEY_STORE);
    const headers = new Headers(options.headers || {});
    if (key) headers.set("X-API-Key", key);
    const r = await fetch(url, { ...options, headers });
    if (r.status !== 401) return r;
    const body = await r.json().catch(() => ({}));
    const said = body.error ? body.error.message : "HTTP 401";
    onAsk();
    await askForKey(key ? `Wrong key: the service refused it (${said}). Enter the right one.`
      : `This service needs an API key (${said}). Enter it to continue.`);
  }
}

const takes = {};  // method -> the parameter names it accepts (a request may give no others)
const stepsOf = {};  // method -> its main step count: its "steps" where it has one (IDG-EG's first integer is paths),
// else the first integer parameter GET /models lists (AGI's and LA's max_iter)

async function loadModels() {
  try {
    const r = await api("/models");
    const body = await r.json();
    if (!r.ok) throw new Error(body.error ? body.error.message : r.statusText);
    for (const m of body.models) $("model").add(new Option(`${m.name} (${m.input_size}px)`, m.name));
    for (const [name, params] of Object.entries(body.method_parameters || {})) {
      takes[name] = new Set(params.map((p) => p.name));
      const first = params.find((p) => p.name === "steps") || params.find((p) => p.type === "integer");
      if (first) stepsOf[name] = first.name;
    }
    if (body.presets && body.presets.length) {  // what each preset sets, costs and where it stands, from the service
      const select = $("preset");
      select.replaceChildren();
      for (const p of body.presets) {
        const cost = p.cost.idg ? `, ${p.cost.idg.forward_passes} passes` : "";
        const option = new Option(`${p.name}${p.default ? " (default" + cost + ")" : cost ? ` (${cost.slice(2)})` : ""}`, p.name,
          p.default, p.default);
        option.title = `${p.summary}; ${p.standing}`;
        select.add(option);
      }
    }
    for (const [name, summary] of Object.entries(body.methods)) {
      $("method").add(new Option(summary, name, name === "idg", name === "idg"));
      $("compare").add(new Option(summary, name));
    }
  } catch (e) { showError(`Could not reach the service: ${e.message}`); }
}

function choose(blob, name) {
  chosen = { blob, name };
  $("preview").src = URL.createObjectURL(blob);
  $("preview").hidden = false;
  $("run").disabled = $("first-look").disabled = false;
  showError("");
}

function setupInput() {
  const drop = $("drop");
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault(); drop.classList.remove("over");
    if (e.dataTransfer.files.length) choose(e.dataTransfer.files[0], e.dataTransfer.files[0].name);
  });
  $("file").addEventListener("change", (e) => { if (e.target.files.length) choose(e.target.files[0], e.target.files[0].name); });
  for (const name of SAMPLES) {
    const img = new Image();
    img.src = `/static/samples/${name}`; img.alt = name; img.title = name.replace(".jpg", "");
    img.addEventListener("click", async () => {
      document.querySelectorAll("#samples img").forEach((i) => i.classList.remove("chosen"));
      img.classList.add("chosen");
      choose(await (await fetch(img.src)).blob(), name);
    });
    $("samples").appendChild(img);
  }
  const outlinesHere = () => { // the service's outlines of the strongest pixels; with Regions on, the panels' own slider
    $("outline-share").disabled = $("visualization").value !== "outlines" || $("regions").value !== "";
  };
  $("visualization").addEventListener("change", outlinesHere);
  $("regions").addEventListener("change", outlinesHere);
  outlinesHere();
  $("run").addEventListener("click", () => run([$("method").value, $("compare").value]));
  // a first look: Grad-CAM's coarse map in about a second, beside the chosen method's
  $("first-look").addEventListener("click", () => run(["gradcam", $("method").value]));
}

function newPanel(method) {
  const panel = $("panel-template").content.firstElementChild.cloneNode(true);
  panel.dataset.method = method;
  panel.querySelector(".title").textContent = $("method").querySelector(`option[value="${method}"]`).textContent;
  $("results").appendChild(panel);
  return panel;
}

async function* sse(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
      const fields = Object.fromEntries(block.split("\n").map((l) => [l.slice(0, l.indexOf(": ")), l.slice(l.indexOf(": ") + 2)]));
      yield { event: fields.event, data: JSON.parse(fields.data) };
    }
  }
}

const STATUS = {
  accepted: () => "accepted",
  queued: (d) => `queued (position ${d.position})`,
  started: (d) => `started after ${d.queued_ms} ms in the queue`,
  progress: (d) => `${d.done || "round " + d.round} done; next: ${d.next || "more"} (${d.points} points)`,
};

// What a person sees of the map (docs/methods/visualization.md): the Display controls' fields, each only where it was
// changed from its default (a request that changes none is the one the page always sent), or the reason the service
// would refuse them, said here instead of sent. The page never sends outlier_perc, the clip bounds' alternative.
function displayFields() {
  const fields = [];
  if ($("polarity").value) fields.push(["polarity", $("polarity").value]);
  if ($("color-map").value) fields.push(["color_map", $("color-map").value]);
  const lower = $("clip-lower").value.trim(), upper = $("clip-upper").value.trim();
  if (lower || upper) {
    if (lower && !(Number(lower) >= 0 && Number(lower) < 100)) {
      return { error: `Clip from % is a percentile from 0 to below 100, not ${lower}.` };
    }
    if (upper && !(Number(upper) > 0 && Number(upper) <= 100)) {
      return { error: `Clip to % is a percentile above 0 up to 100, not ${upper}.` };
    }
    const lo = lower ? Number(lower) : 0, hi = upper ? Number(upper) : 100;  // the service's values for an empty one
    if (lo >= hi) {
      return { error: `Clip from % (${lo}) must be below Clip to % (${hi}): nothing is shown at and below the first ` +
        "percentile and the colour is full from the second. Nothing was sent." };
    }
    if (lower) fields.push(["clip_percent_lowerbound", lower]);
    if (upper) fields.push(["clip_percent_upperbound", upper]);
  }
  // outlines of ranked regions (XRAI's, Grad-CAM's blobs) are drawn here from the answer (Regions, its area slider); of a
  // plain map, by the service
  const outlines = $("visualization").value === "outlines" && $("regions").value === "";
  if (outlines) {
    const share = Number($("outline-share").value);
    if (!(share >= 1 && share <= 100)) {
      return { error: `Outlined % is a share of the image from 1 to 100, not ${$("outline-share").value || "empty"}.` };
    }
    fields.push(["visualization", "outlines"], ["outline_share", String(share / 100)]);
  }
  const overlayType = $("overlay-type").value;
  if (overlayType !== "original") fields.push(["overlay_type", overlayType]);
  // the service's overlay where the page cannot compose it from the input and the heatmap: outlines, another backdrop
  return { fields, overlay: outlines || overlayType !== "original" };
}

async function explain(method, panel, display) {
  const form = new FormData();
  form.append("file", chosen.blob, chosen.name);
  form.append("model", $("model").value);
  form.append("method", method);
  form.append("return_input", "true");
  form.append("return_overlay", display.overlay ? "true" : "false");
  form.append("preset", $("preset").value);
  form.append("faithfulness", "insertion,deletion");
  if ($("steps").value && stepsOf[method]) form.append(stepsOf[method], $("steps").value);
  if ($("target").value) form.append("target", $("target").value);
  if ($("regions").value) form.append("postprocess", $("regions").value);
  for (const [name, value] of display.fields) form.append(name, value);
  const status = panel.querySelector(".status");
  status.textContent = "sending…";
  const r = await api("/attribute/stream", { method: "POST", body: form }, () => { status.textContent = "waiting for the API key"; });
  if (!r.ok) {
    const body = await r.json().catch(() => ({}));
    throw new Error(body.error ? body.error.message : `HTTP ${r.status}`);
  }
  for await (const { event, data } of sse(r)) {
    if (event === "result") { status.textContent = "done"; render(panel, data); return; }
    if (event === "error") throw new Error(data.message);
    status.textContent = (STATUS[event] || (() => event))(data);
  }
  throw new Error("the connection closed before the result");
}

async function run(asked) {
  const display = displayFields();
  if (display.error) { showError(display.error); return; }  // what the service would refuse (422) is not sent
  showError("");
  $("results").innerHTML = "";
  $("run").disabled = $("first-look").disabled = true;
  const methods = asked.filter((m, i, a) => m && a.indexOf(m) === i);
  const failures = [];  // every method's, not the last one's alone
  await Promise.all(methods.map(async (m) => {
    const panel = newPanel(m);
    try { await explain(m, panel, display); } catch (e) {
      panel.querySelector(".status").textContent = "failed";
      failures.push(`${m}: ${e.message}`);
      showError(failures.join(" · "));
    }
  }));
  $("run").disabled = $("first-look").disabled = false;
}

function render(panel, d) {
  panel.querySelector(".body").hidden = false;
  const list = panel.querySelector(".prediction");
  list.innerHTML = "";
  for (const c of d.prediction) {
    const li = document.createElement("li");
    li.textContent = `${c.name} (${(100 * c.probability).toFixed(1)}%)${c.index === d.target.index ? " ← explained" : ""}`;
    list.appendChild(li);
  }
  panel.querySelector(".input-img").src = `data:image/png;base64,${d.input_png}`;
  const heat = panel.querySelector(".heat-img");
  heat.src = panel.querySelector(".raw-img").src = `data:image/png;base64,${d.heatmap_png}`;
  const slider = panel.querySelector(".opacity");
  if (d.overlay_png) {  // the service's own overlay (outlines, another backdrop): shown whole, the slider fades it out
    heat.src = `data:image/png;base64,${d.overlay_png}`;
    slider.value = 100;
  }
  const apply = () => { heat.style.opacity = slider.value / 100; };
  slider.addEventListener("input", apply); apply();
  drawCurve(panel.querySelector(".chart"), d.curve);
  if (d.regions) showRegions(panel, d).catch((e) => { panel.querySelector(".area-value").textContent = e.message; });
  panel.querySelector(".cost").textContent =
    `${d.cost.forward_passes} forward / ${d.cost.backward_passes} backward passes; queued ${d.timings.queued_ms.toFixed(0)} ms, ` +
    `computed ${d.timings.compute_ms.toFixed(0)} ms, total ${d.timings.total_ms.toFixed(0)} ms`;
  const f = d.faithfulness;
  panel.querySelector(".faithfulness").textContent = f
    ? `Faithfulness: insertion ${f.insertion.toFixed(3)} (higher is better), deletion ${f.deletion.toFixed(3)} (lower is better), ` +
      `${f.steps} steps. These say how fast the model's confidence rises as the map's most important pixels are put back, ` +
      `and falls as they are removed: a map that points at what the model uses scores high insertion and low deletion.`
    : "";
}

// the ranked regions (XRAI's or Grad-CAM's blobs) over the model's input: the first regions covering at most the slider's share of the image outlined
// (regions.js), the rest veiled; redrawn here as the slider moves, with no new request
async function showRegions(panel, d) {
  const fig = panel.querySelector(".regions-fig");
  fig.hidden = false;
  panel.querySelector(".regions-photo").src = `data:image/png;base64,${d.input_png}`;
  const decoded = await decodeLabels(d.regions.labels_png);
  const shares = d.regions.regions.map((r) => r.share);
  const canvas = panel.querySelector(".regions-canvas");
  canvas.width = decoded.width; canvas.height = decoded.height;
  const ctx = canvas.getContext("2d");
  const slider = panel.querySelector(".area");
  const thickness = Math.max(1, Math.round(Math.min(decoded.width, decoded.height) / 112));  // as the service's outlines
  const draw = () => {
    const count = topCount(shares, slider.value / 100);
    const edge = outlineMask(decoded, count, thickness);
    const image = ctx.createImageData(decoded.width, decoded.height);
    let covered = 0;
    for (let i = 0; i < edge.length; i++) {
      const inside = decoded.labels[i] <= count;
      covered += inside;
      if (edge[i]) image.data.set([255, 225, 77, 255], 4 * i);
      else if (!inside) image.data.set([20, 24, 33, 150], 4 * i);
    }
    ctx.putImageData(image, 0, 0);
    fig.dataset.regions = count;
    panel.querySelector(".area-value").textContent =
      `${count} of ${shares.length} regions: ${(100 * covered / edge.length).toFixed(0)} % of the image (at most ${slider.value} %)`;
  };
  slider.addEventListener("input", draw);
  draw();
}

function drawCurve(svg, c) {
  const NS = "http://www.w3.org/2000/svg";
  const W = 520, H = 260, L = 48, R = 12, T = 12, B = 34;
  svg.innerHTML = "";
  const xs = [...c.probe_alphas, ...c.alphas], ys = [...c.probe_values, ...c.values];
  if (!ys.length) { svg.innerHTML = `<text x="20" y="40">this method has no path curve</text>`; return; }
  let lo = Math.min(...ys), hi = Math.max(...ys);
  if (hi - lo < 1e-9) { lo -= 1; hi += 1; }
  const sx = (a) => L + a * (W - L - R), sy = (v) => T + (1 - (v - lo) / (hi - lo)) * (H - T - B);
  const el = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.appendChild(e); return e;
  };
  el("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#888" });
  el("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#888" });
  for (const t of [0, 0.25, 0.5, 0.75, 1]) el("text", { x: sx(t), y: H - B + 14, "font-size": 10, "text-anchor": "middle" }, t);
  for (const v of [lo, (lo + hi) / 2, hi]) el("text", { x: L - 4, y: sy(v) + 3, "font-size": 10, "text-anchor": "end" }, v.toFixed(2));
  el("text", { x: (W + L) / 2, y: H - 4, "font-size": 11, "text-anchor": "middle" }, "α (path position)");
  el("text", { x: 12, y: (H - B) / 2, "font-size": 11, transform: `rotate(-90 12 ${(H - B) / 2})`, "text-anchor": "middle" }, `target ${c.output}`);
  if (c.input === "noisy_copy") {
    el("text", { class: "curve-input", x: L + 6, y: T + 10, "font-size": 10 }, c.probe_input === "photo"
      ? "line: the photo's probe; dots: the first noisy copy's samples (SmoothGrad)"
      : "the path of the first noisy copy (SmoothGrad), not of the photo");
  }
  const line = c.probe_alphas.length ? [c.probe_alphas, c.probe_values] : [c.alphas, c.values];
  el("polyline", { class: "probe", fill: "none", stroke: "#9aa3b5", "stroke-width": 2,
    points: line[0].map((a, i) => `${sx(a)},${sy(line[1][i])}`).join(" ") });
  const imp = c.importance.length ? c.importance.map(Math.abs) : c.alphas.map(() => 1);
  const top = Math.max(...imp, 1e-12);
  c.alphas.forEach((a, i) => {
    const s = imp[i] / top;
    el("circle", { class: "sample", cx: sx(a), cy: sy(c.values[i]), r: 2 + 4 * s,
      fill: `hsl(${30 - 30 * s}, 90%, ${60 - 25 * s}%)`, stroke: "#333", "stroke-width": 0.4 })
      .appendChild(document.createElementNS(NS, "title")).textContent =
        `α=${a.toFixed(3)} ${c.output}=${c.values[i].toFixed(3)}` + (c.importance.length ? ` dF/dα=${c.importance[i].toFixed(3)}` : "");
  });
}

loadModels();
setupInput();
