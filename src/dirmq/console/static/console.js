// The console's one script (no inline script anywhere: the CSP allows only this origin's
// files). Live refresh of the parts marked .live, the refresh interval and theme kept in
// localStorage, charts of the server's samples when uPlot is there.
const store = window.localStorage;

// htmx under the console's strict CSP (see static/README.md): set before htmx reads its
// configuration at DOMContentLoaded (htmx is loaded deferred, before this module).
if (window.htmx) {
  Object.assign(window.htmx.config, {
    allowEval: false,
    includeIndicatorStyles: false,
    allowScriptTags: false,
    selfRequestsOnly: true,
    historyCacheSize: 0,
  });
  document.addEventListener("htmx:afterSwap", () => showRates());
}
const root = document.documentElement;

// -- theme: the system's, unless the user chose one ---------------------------------------
function applyTheme() {
  const chosen = store.getItem("dirmq.theme");
  if (chosen) root.dataset.theme = chosen;
  else delete root.dataset.theme;
}
applyTheme();
document.getElementById("theme")?.addEventListener("click", () => {
  const dark = root.dataset.theme
    ? root.dataset.theme === "dark"
    : window.matchMedia("(prefers-color-scheme: dark)").matches;
  store.setItem("dirmq.theme", dark ? "light" : "dark");
  applyTheme();
});

// -- live refresh ---------------------------------------------------------------------------
const select = document.getElementById("refresh");
let seconds = Number(store.getItem("dirmq.refresh") ?? "2");
if (![0, 2, 5, 10].includes(seconds)) seconds = 2;
if (select) {
  select.value = String(seconds);
  select.addEventListener("change", () => {
    seconds = Number(select.value);
    store.setItem("dirmq.refresh", String(seconds));
    schedule();
  });
}

function paused() {
  // Not while the tab is hidden, nor while the user has rows selected, a confirmation open
  // or is typing.
  if (document.hidden) return true;
  if (document.querySelector("input.pick:checked")) return true;
  if (document.querySelector(".live details[open]")) return true; // a confirmation is open
  const active = document.activeElement;
  return Boolean(active && active.closest("form") && active.matches("input, textarea, select:not(#refresh)"));
}

async function refresh(part) {
  if (window.htmx && part.hasAttribute("hx-get")) {
    window.htmx.trigger(part, "dirmq:refresh"); // htmx fetches and swaps it
    return;
  }
  const response = await fetch(part.dataset.src, { cache: "no-cache", credentials: "same-origin" });
  if (response.status !== 200) return; // 304: unchanged
  const text = await response.text();
  const wanted = part.dataset.select;
  if (wanted) {
    const found = new DOMParser().parseFromString(text, "text/html").querySelector(wanted);
    if (found) part.replaceChildren(found);
  } else {
    const doc = new DOMParser().parseFromString(text, "text/html");
    part.replaceChildren(...doc.body.childNodes);
  }
  if (window.htmx) window.htmx.process(part);
  showRates();
}

let timer = null;
function schedule() {
  if (timer) clearInterval(timer);
  timer = null;
  if (seconds > 0) {
    timer = setInterval(() => {
      if (paused()) return;
      for (const part of document.querySelectorAll(".live[data-src]")) refresh(part).catch(() => {});
      drawCharts();
    }, seconds * 1000);
  }
}
schedule();

// -- rates (the server's samples, when it has them) -------------------------------------------
async function showRates() {
  const table = document.querySelector("table[data-rates]");
  const cells = document.querySelectorAll("td.rate[data-queue]");
  if (!table || !cells.length) return; // a server without samples: no rates
  let rates;
  try {
    const response = await fetch(table.dataset.rates, { cache: "no-cache" });
    if (!response.ok) return;
    rates = await response.json();
  } catch {
    return;
  }
  const queues = rates.queues ?? {};
  for (const cell of cells) {
    const found = queues[cell.dataset.queue];
    const value = found ? found[`${cell.dataset.rate}_per_s`] : null;
    cell.textContent = value == null ? "-" : Number(value).toFixed(1);
  }
}
showRates();

// -- charts ---------------------------------------------------------------------------------
const charts = new Map();
async function drawCharts() {
  const section = document.querySelector(".charts[data-samples]");
  if (!section || !window.uPlot) return;
  let data;
  try {
    const response = await fetch(section.dataset.samples, { cache: "no-cache" });
    if (!response.ok) return;
    data = await response.json();
  } catch {
    return;
  }
  for (const box of section.querySelectorAll(".chart[data-series]")) {
    const names = box.dataset.series.split(",").filter((n) => Array.isArray(data[n]));
    // The hour before the server's first sample is empty: start where the data does.
    const times = data.t ?? [];
    let first = times.findIndex((_, i) => names.some((n) => data[n][i] != null));
    if (first < 0) first = Math.max(0, times.length - 1);
    const series = [times.slice(first), ...names.map((n) => data[n].slice(first))];
    const old = charts.get(box.id);
    if (old) {
      old.setData(series);
      continue;
    }
    // A canvas takes colours, not CSS variables: read the theme's.
    const style = getComputedStyle(root);
    const colour = (i) => style.getPropertyValue(`--series-${i}`).trim() || "#0b57d0";
    const opts = {
      title: box.dataset.title,
      width: Math.max(300, box.clientWidth || 600),
      height: 200,
      series: [{}, ...names.map((n, i) => ({ label: n, stroke: colour(i), width: 2 }))],
    };
    charts.set(box.id, new window.uPlot(opts, series, box));
  }
}
window.addEventListener("load", drawCharts);

// -- confirmations --------------------------------------------------------------------------
for (const form of document.querySelectorAll("form")) {
  form.addEventListener("submit", (event) => {
    const button = event.submitter;
    const needsPick = button && ["redrive-selected", "delete-selected"].includes(button.id);
    if (needsPick && !form.querySelector("input.pick:checked")) {
      event.preventDefault(); // said on the page, not in a dialog
      let said = form.querySelector(".pick-first");
      if (!said) {
        said = document.createElement("p");
        said.className = "pick-first error";
        said.setAttribute("role", "alert");
        form.querySelector(".actions")?.after(said);
      }
      said.textContent = "Select the messages first.";
    }
  });
}
