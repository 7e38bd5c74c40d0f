// The job page, live: one WebSocket (/ws/jobs/<id>/) brings status, log lines, GPU
// metrics and alerts. The log view keeps only a window of lines in the DOM (a 1,000,000-
// line log stays smooth); older and newer lines are fetched by number from the API.
// While the socket is down the status partial polls (htmx) and the socket reconnects by
// itself, resuming after the last line received, so no line is missed or shown twice.
(() => {
  "use strict";
  const root = document.querySelector("[data-job-live]");
  if (!root) return;

  const WINDOW = 2000; // lines kept in the DOM
  const PAGE = 500; // lines fetched per step when scrolling through history
  const TAIL = 1000; // lines shown when jumping to live
  const html = document.documentElement;

  const csrfToken = () => (document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/) || [])[1] || "";

  const FETCH_TIMEOUT_MS = 20000; // a fetch that hangs must not hold the log window's "busy" forever

  async function getJSON(url) {
    const response = await fetch(url, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
      signal: AbortSignal.timeout(FETCH_TIMEOUT_MS),
    });
    if (!response.ok) throw new Error(`${url}: ${response.status}`);
    return response.json();
  }

  // ---- log window ------------------------------------------------------------------------

  class LogWindow {
    constructor(element, logsUrl, nodes) {
      this.viewport = element.querySelector("[data-log-window]");
      this.list = element.querySelector("[data-log-lines]");
      this.info = element.querySelector("[data-log-info]");
      this.liveButton = element.querySelector("[data-log-live]");
      this.pauseButton = element.querySelector("[data-log-pause]");
      this.filterInput = element.querySelector("[data-log-filter]");
      this.rankSelect = element.querySelector("[data-log-rank]");
      this.logsUrl = logsUrl;
      this.first = 0; // numbers of the first and last line in the DOM (0: none)
      this.last = 0;
      this.latest = 0; // the highest line number received
      this.following = true; // showing the newest lines, scrolled to the bottom
      this.paused = false;
      this.busy = false; // a range fetch is running
      this.textFilter = "";
      this.rankFilter = "";
      if (nodes > 1) {
        for (let rank = 0; rank < nodes; rank += 1) this.rankSelect.add(new Option(`Rank ${rank}`, String(rank)));
      } else {
        this.rankSelect.closest("label").hidden = true;
        this.list.classList.add("single-rank");
      }
      this.viewport.addEventListener("scroll", () => this.onScroll(), { passive: true });
      this.liveButton.addEventListener("click", () => this.jumpToLive());
      this.pauseButton.addEventListener("click", () => this.setPaused(!this.paused));
      this.filterInput.addEventListener("input", () => {
        this.textFilter = this.filterInput.value.toLowerCase();
        this.applyFilter();
      });
      this.rankSelect.addEventListener("change", () => {
        this.rankFilter = this.rankSelect.value;
        this.applyFilter();
      });
      this.updateInfo();
    }

    row(line) {
      const row = document.createElement("div");
      row.className = "log-line";
      // Number and rank are drawn by CSS (attr()), so copying text copies only the log.
      row.dataset.line = line.line_no;
      row.dataset.rank = line.rank;
      row.textContent = line.text;
      row.hidden = !this.matches(row);
      return row;
    }

    matches(row) {
      if (this.rankFilter !== "" && row.dataset.rank !== this.rankFilter) return false;
      return !this.textFilter || row.textContent.toLowerCase().includes(this.textFilter);
    }

    applyFilter() {
      for (const row of this.list.children) row.hidden = !this.matches(row);
      if (this.following) this.scrollToBottom();
      this.updateInfo();
    }

    append(lines) {
      const fragment = document.createDocumentFragment();
      for (const line of lines) fragment.append(this.row(line));
      this.list.append(fragment);
      if (!this.first) this.first = lines[0].line_no;
      this.last = lines[lines.length - 1].line_no;
      this.trimTop();
    }

    prepend(lines) {
      const before = this.viewport.scrollHeight;
      const fragment = document.createDocumentFragment();
      for (const line of lines) fragment.append(this.row(line));
      this.list.prepend(fragment);
      this.first = lines[0].line_no;
      if (!this.last) this.last = lines[lines.length - 1].line_no;
      this.viewport.scrollTop += this.viewport.scrollHeight - before; // the view stays put
      while (this.list.children.length > WINDOW) {
        this.list.lastElementChild.remove();
        this.last -= 1;
      }
    }

    trimTop() {
      let removed = 0;
      while (this.list.children.length > WINDOW) {
        removed += this.list.firstElementChild.offsetHeight;
        this.list.firstElementChild.remove();
        this.first += 1;
      }
      if (removed && !this.following) this.viewport.scrollTop -= removed;
    }

    clear() {
      this.list.replaceChildren();
      this.first = 0;
      this.last = 0;
    }

    // Lines from the socket (backfill, live, or what a resume filled in).
    live(lines) {
      const fresh = lines.filter((line) => line.line_no > this.latest);
      if (!fresh.length) return; // already had them
      this.latest = fresh[fresh.length - 1].line_no;
      if (this.following && !this.paused && !this.busy) {
        const next = fresh.filter((line) => line.line_no > this.last);
        if (this.last && next.length && next[0].line_no !== this.last + 1) {
          this.fetchForward(); // the window is behind: fill it from the API
        } else if (next.length) {
          this.append(next);
          this.scrollToBottom();
        }
      }
      this.updateInfo();
    }

    scrollToBottom() {
      this.viewport.scrollTop = this.viewport.scrollHeight;
    }

    atBottom() {
      return this.viewport.scrollHeight - this.viewport.scrollTop - this.viewport.clientHeight < 24;
    }

    onScroll() {
      if (this.busy) return;
      if (this.atBottom()) {
        if (this.last < this.latest) this.fetchForward();
        else if (!this.paused) this.following = true;
      } else {
        this.following = false; // the reader scrolled up: stop moving under them
      }
      if (this.viewport.scrollTop < 200 && this.first > 1) this.fetchBackward();
      this.updateInfo();
    }

    async fetchRange(since, limit) {
      const data = await getJSON(`${this.logsUrl}?since_line=${since}&limit=${limit}`);
      return data.lines;
    }

    async fetchBackward() {
      if (this.busy || this.first <= 1) return;
      this.busy = true;
      try {
        const since = Math.max(0, this.first - 1 - PAGE);
        const lines = await this.fetchRange(since, this.first - 1 - since);
        if (lines.length) this.prepend(lines);
      } catch (error) {
        console.warn("older log lines unavailable", error);
      } finally {
        this.busy = false;
        this.updateInfo();
      }
    }

    async fetchForward() {
      if (this.busy) return;
      this.busy = true;
      try {
        while (this.last < this.latest) {
          const lines = await this.fetchRange(this.last, PAGE);
          if (!lines.length) break;
          const stick = this.atBottom();
          this.append(lines);
          if (stick && this.last >= this.latest && !this.paused) {
            this.following = true;
            this.scrollToBottom();
          }
          if (!this.following) break; // one page per scroll step when reading history
        }
      } catch (error) {
        console.warn("newer log lines unavailable", error);
      } finally {
        this.busy = false;
        this.updateInfo();
      }
    }

    async jumpToLive() {
      this.paused = false;
      this.pauseButton.setAttribute("aria-pressed", "false");
      this.pauseButton.textContent = "Pause";
      if (this.busy) return;
      this.busy = true;
      try {
        const since = Math.max(0, this.latest - TAIL);
        const lines = await this.fetchRange(since, TAIL);
        this.clear();
        if (lines.length) this.append(lines);
        // Lines that arrived during the fetch follow from the socket's next message; any
        // gap is filled by fetchForward below.
      } catch (error) {
        console.warn("live tail unavailable", error);
      } finally {
        this.busy = false;
      }
      this.following = true;
      this.scrollToBottom();
      if (this.last < this.latest) await this.fetchForward();
      this.updateInfo();
    }

    setPaused(paused) {
      this.paused = paused;
      this.pauseButton.setAttribute("aria-pressed", String(paused));
      this.pauseButton.textContent = paused ? "Resume" : "Pause";
      if (paused) this.following = false;
      else this.jumpToLive();
      this.updateInfo();
    }

    updateInfo() {
      const behind = this.latest - this.last;
      this.liveButton.hidden = this.following && !this.paused && behind <= 0;
      this.liveButton.textContent = behind > 0 ? `Jump to live (${behind} new)` : "Jump to live";
      const parts = [];
      if (this.last) parts.push(`lines ${this.first}–${this.last} of ${this.latest}`);
      else parts.push(this.latest ? `${this.latest} lines` : "no output yet");
      if (this.paused) parts.push("paused");
      if (this.textFilter || this.rankFilter) {
        const rows = Array.from(this.list.children);
        const shown = rows.filter((row) => !row.hidden).length;
        parts.push(`${shown} of ${rows.length} loaded ${rows.length === 1 ? "line matches" : "lines match"} the filter`);
      }
      this.info.textContent = parts.join(" · ");
    }
  }

  // ---- charts ---------------------------------------------------------------------------------
  // Figures come built from the server (jobs.metrics.job_figures): a line per GPU up to 8,
  // above that the mean with a min–max band (each GPU on demand). Live samples extend them;
  // a GPU the charts don't know yet makes them reload from the server. Status messages that
  // carry a `marker` (pause, resume, preemption) add a labelled line.

  const AGGREGATE = ["agg/min", "agg/max", "agg/mean"];

  class Charts {
    constructor(element, metricsUrl, startedAt) {
      this.element = element;
      this.metricsUrl = metricsUrl;
      this.startedAt = startedAt;
      this.range = "15";
      this.note = element.querySelector("[data-metrics-note]");
      this.grid = element.querySelector("[data-metrics-charts]");
      this.perGpuSwitch = element.querySelector("[data-per-gpu-switch]");
      this.perGpuButton = element.querySelector("[data-per-gpu]");
      this.divs = Object.fromEntries(
        [...element.querySelectorAll("[data-chart]")].map((div) => [div.dataset.chart, div]),
      );
      this.traces = {}; // chart -> {meta key -> trace index}
      this.aggregate = false;
      this.perGpu = false;
      this.ready = false;
      this.reloading = null;
      this.liveCount = 0;
      for (const button of element.querySelectorAll("[data-range]")) {
        button.addEventListener("click", () => {
          this.range = button.dataset.range;
          for (const other of element.querySelectorAll("[data-range]")) {
            other.setAttribute("aria-pressed", String(other === button));
          }
          this.load();
        });
      }
      this.perGpuButton.addEventListener("click", () => {
        this.perGpu = !this.perGpu;
        this.showPerGpu();
      });
    }

    since() {
      if (this.range === "all") return this.startedAt || new Date(0).toISOString();
      return new Date(Date.now() - Number(this.range) * 60000).toISOString();
    }

    showNote(text) {
      this.note.textContent = text;
      this.note.hidden = !text;
    }

    async load() {
      if (!this.metricsUrl) {
        this.showNote("GPU metrics are not available in this installation.");
        return null;
      }
      let data;
      try {
        data = await getJSON(`${this.metricsUrl}?since=${encodeURIComponent(this.since())}`);
      } catch (error) {
        this.showNote("GPU metrics are unavailable right now.");
        return null;
      }
      this.summary(data.summary || {});
      const empty = !data.samples.length;
      // No readings: a sentence, not empty axes (plotly.js would draw Jan 2000 on them).
      this.showNote(empty ? data.note || "No GPU readings in this time range yet." : data.note || "");
      this.grid.hidden = empty;
      // Nothing to chart and a reason why (e.g. "no GPU"): the reason alone says it.
      for (const part of this.element.querySelectorAll(".range-switch, [data-metrics-summary]")) {
        part.hidden = empty && Boolean(data.note) && this.range === "15";
      }
      if (typeof Plotly === "undefined") {
        this.showNote("Charts need plotly.js, which is not installed (run `make setup`).");
        return data;
      }
      if (empty) {
        this.perGpuSwitch.hidden = true;
        this.traces = {}; // the first live reading reloads, then draws
        this.ready = true;
        return data;
      }
      const config = { displayModeBar: false, responsive: true };
      this.aggregate = false;
      for (const [name, div] of Object.entries(this.divs)) {
        const figure = data.figures[name];
        if (!figure) continue;
        const meta = figure.layout.meta || {};
        this.aggregate = Boolean(meta.aggregate);
        await Plotly.react(div, figure.data, figure.layout, config);
        this.traces[name] = Object.fromEntries(figure.data.map((trace, index) => [trace.meta, index]));
        if (window.ggCharts) window.ggCharts.wire(div.closest("[data-chart-block]"), div);
        if (meta.aggregate) {
          this.perGpuSwitch.querySelector("[data-aggregate-note]").textContent =
            `${meta.gpus} GPUs: the mean, with the range from the lowest to the highest GPU.`;
        }
      }
      this.perGpuSwitch.hidden = !this.aggregate;
      if (this.aggregate && this.perGpu) this.showPerGpu();
      this.ready = true;
      return data;
    }

    showPerGpu() {
      this.perGpuButton.setAttribute("aria-pressed", String(this.perGpu));
      this.perGpuButton.textContent = this.perGpu ? "Show the mean and range" : "Show each GPU";
      for (const [name, div] of Object.entries(this.divs)) {
        if (!div.data) continue;
        const visible = div.data.map((trace) => AGGREGATE.includes(trace.meta) !== this.perGpu);
        Plotly.restyle(div, { visible });
        window.ggCharts?.refresh(div.closest("[data-chart-block]"), div);
      }
    }

    summary(figures) {
      const format = {
        mean_utilization: (v) => `${v} %`,
        peak_memory_mib: (v) => `${(v / 1024).toFixed(1)} GiB`,
      };
      for (const [key, render] of Object.entries(format)) {
        const cell = this.element.querySelector(`[data-summary="${key}"]`);
        if (cell) cell.textContent = figures[key] == null ? "—" : render(figures[key]);
      }
    }

    // A pause, resume or preemption from the status message: a marker on every chart.
    mark(message) {
      if (!this.ready || !message.marker || typeof Plotly === "undefined") return;
      for (const div of Object.values(this.divs)) {
        const layout = div.layout || {};
        const annotations = layout.annotations || [];
        if (annotations.some((a) => a.x === message.at && a.text === message.marker)) continue;
        Plotly.relayout(div, {
          shapes: [...(layout.shapes || []), {
            type: "line", xref: "x", yref: "paper", x0: message.at, x1: message.at, y0: 0, y1: 1,
            line: { color: "#555", width: 1, dash: "dot" },
          }],
          annotations: [...annotations, {
            x: message.at, xref: "x", y: 1, yref: "paper", yanchor: "bottom",
            text: message.marker, showarrow: false, font: { size: 10 },
          }],
        });
      }
    }

    reload() {
      if (!this.reloading) this.reloading = this.load().finally(() => { this.reloading = null; });
    }

    live(message) {
      if (message.note) this.showNote(message.note);
      if (!this.ready || !message.samples || !message.samples.length) return;
      const known = this.traces.utilization || {};
      if (message.samples.some((s) => !(`${s.node}/gpu${s.gpu}` in known))) {
        this.reload(); // a first reading or a new GPU: the server decides lines or band
        return;
      }
      const ticks = new Map(); // at -> samples of that tick
      for (const sample of message.samples) {
        if (!ticks.has(sample.at)) ticks.set(sample.at, []);
        ticks.get(sample.at).push(sample);
      }
      for (const [name, div] of Object.entries(this.divs)) {
        const index = this.traces[name] || {};
        const update = new Map();
        const push = (trace, x, y) => {
          const entry = update.get(trace) || { x: [], y: [] };
          entry.x.push(x);
          entry.y.push(y);
          update.set(trace, entry);
        };
        for (const sample of message.samples) push(index[`${sample.node}/gpu${sample.gpu}`], sample.at, sample[name]);
        if (this.aggregate) {
          for (const [at, samples] of ticks) {
            const values = samples.map((s) => s[name]).filter((v) => v != null);
            if (!values.length) continue;
            const mean = values.reduce((a, b) => a + b, 0) / values.length;
            push(index["agg/min"], at, Math.min(...values));
            push(index["agg/max"], at, Math.max(...values));
            push(index["agg/mean"], at, Math.round(mean * 100) / 100);
          }
        }
        const indices = [...update.keys()].filter((i) => i !== undefined);
        Plotly.extendTraces(
          div,
          { x: indices.map((i) => update.get(i).x), y: indices.map((i) => update.get(i).y) },
          indices,
          20000,
        );
        window.ggCharts?.refresh(div.closest("[data-chart-block]"), div);
      }
      this.liveCount += 1;
      if (this.liveCount % 12 === 0) {
        getJSON(`${this.metricsUrl}?since=${encodeURIComponent(new Date().toISOString())}`)
          .then((data) => this.summary(data.summary || {}))
          .catch(() => {});
      }
    }
  }

  // ---- alerts ---------------------------------------------------------------------------------

  const alertSection = root.querySelector("[data-testid=alerts]");
  const alertList = alertSection.querySelector("ul");
  function showAlert(alert, prepend = true) {
    const item = document.createElement("li");
    item.className = `alert alert-${alert.severity}`;
    item.dataset.kind = alert.kind;
    const time = document.createElement("time");
    time.dateTime = alert.at;
    time.textContent = new Date(alert.at).toLocaleTimeString();
    item.append(time, " ", alert.message);
    if (prepend) alertList.prepend(item);
    else alertList.append(item);
    alertSection.hidden = false;
  }

  // ---- the socket -----------------------------------------------------------------------------

  const logs = new LogWindow(root, root.dataset.logsUrl, Number(root.dataset.nodes || 1));
  const charts = new Charts(
    root.querySelector("[data-testid=metrics]"),
    root.dataset.metricsUrl,
    root.dataset.startedAt,
  );
  const liveState = root.querySelector("[data-testid=live-state]");

  // A finished job has nothing live to show: its log is complete.
  const FINISHED = new Set(["succeeded", "failed", "cancelled"]);
  let finished = root.hasAttribute("data-finished");

  function setState(state, label) {
    liveState.dataset.state = finished && state === "open" ? "ended" : state;
    liveState.textContent = finished && state === "open" ? "finished" : label;
    html.dataset.jobSocket = state;
  }

  // htmx drops a trigger that comes while the partial's previous fetch is in flight, so a
  // status pushed then (provisioning, then running a moment later) was never shown: after each
  // swap the partial is fetched again while it shows an older status than the socket last said.
  let latestStatus = null;
  let refetches = 0;
  document.body.addEventListener("htmx:afterSettle", (event) => {
    const shown = document.getElementById("job-status");
    if (!shown || event.target !== shown || latestStatus === null) return;
    if (shown.dataset.status === latestStatus || refetches >= 5) {
      refetches = 0;
      return;
    }
    refetches += 1;
    setTimeout(() => document.body.dispatchEvent(new CustomEvent("gg:job-changed")), 250);
  });

  function statusChanged(message) {
    if (message.type === "status") latestStatus = message.status;
    if (message.type === "status" && FINISHED.has(message.status) && !finished) {
      finished = true;
      if (liveState.dataset.state === "open") setState("open", "live");
    }
    const shown = document.getElementById("job-status");
    if (!shown || shown.dataset.status !== message.status || message.type === "alert") {
      document.body.dispatchEvent(new CustomEvent("gg:job-changed"));
      if (window.htmx && shown && !shown.hasAttribute("hx-get")) {
        // A finished job's partial no longer polls: fetch it once.
        htmx.ajax("GET", location.pathname, { target: "#job-status", swap: "outerHTML" });
      }
    }
  }

  let socket = null;
  let attempts = 0;
  let everOpened = false;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    // After the first connection, resume after the last line received (no backfill).
    const resume = everOpened && logs.latest ? `?since_line=${logs.latest}` : "";
    socket = new WebSocket(`${scheme}://${location.host}${root.dataset.wsUrl}${resume}`);
    setState("connecting", "connecting…");
    socket.addEventListener("open", () => {
      attempts = 0;
      everOpened = true;
      setState("open", "live");
    });
    socket.addEventListener("message", (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "log") logs.live(message.lines);
      else if (message.type === "status") {
        statusChanged(message);
        charts.mark(message);
      }
      else if (message.type === "metrics") charts.live(message);
      else if (message.type === "alert") {
        showAlert(message);
        statusChanged(message); // the alert is in the timeline too
      }
    });
    socket.addEventListener("close", () => {
      setState("closed", "reconnecting…");
      attempts += 1;
      const delay = Math.min(10000, 500 * 2 ** Math.min(attempts - 1, 5)) * (0.75 + Math.random() / 2);
      setTimeout(connect, delay);
    });
  }

  // Exposed for tests and debugging: the page's live state.
  window.ggJobLive = { logs, charts, reconnect: () => socket && socket.close() };

  // plotly.js (1 MB to run) waits for the first paint: run before it, it kept the page
  // blank. The page's <link rel=preload> has fetched it meanwhile.
  function plotlyAfterFirstPaint() {
    if (typeof Plotly !== "undefined" || !root.dataset.plotlyUrl) return Promise.resolve();
    return new Promise((resolve) => {
      requestAnimationFrame(() =>
        setTimeout(() => {
          const script = document.createElement("script");
          script.src = root.dataset.plotlyUrl;
          script.onload = script.onerror = () => resolve();
          document.head.append(script);
        }, 0),
      );
    });
  }

  connect();
  plotlyAfterFirstPaint().then(() => charts.load()).then((data) => {
    for (const alert of (data && data.alerts) || []) showAlert(alert, false);
  });

  // ---- Self-repair choices: GPU-idle auto-stop, loss explosion, hardware fault ----------------

  const monitorForm = root.querySelector("[data-monitor-form]");
  if (monitorForm && root.dataset.monitorUrl) {
    const state = monitorForm.querySelector("[data-monitor-state]");
    getJSON(root.dataset.monitorUrl)
      .then((data) => {
        monitorForm.elements.idle_auto_stop.checked = data.idle_auto_stop;
        monitorForm.elements.idle_minutes.value = data.idle_minutes ?? "";
        // Self-repair choices: "" follows the organisation's default (null in the API).
        for (const name of ["loss_explosion_pause", "hardware_repair"]) {
          monitorForm.elements[name].value = data[name] === null ? "" : String(data[name]);
        }
      })
      .catch(() => {});
    const choice = (value) => (value === "" ? null : value === "true");
    monitorForm.addEventListener("submit", async (event) => {
      event.preventDefault();
      const minutes = monitorForm.elements.idle_minutes.value;
      const response = await fetch(root.dataset.monitorUrl, {
        method: "PUT",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
        body: JSON.stringify({
          idle_auto_stop: monitorForm.elements.idle_auto_stop.checked,
          idle_minutes: minutes ? Number(minutes) : null,
          loss_explosion_pause: choice(monitorForm.elements.loss_explosion_pause.value),
          hardware_repair: choice(monitorForm.elements.hardware_repair.value),
        }),
      });
      state.textContent = response.ok ? "Saved." : "Not saved.";
    });
  }
})();
