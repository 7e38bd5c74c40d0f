// Live updates of the current organisation (/ws/tenant/): job status changes refresh the
// job table (an htmx partial that listens for `gg:tenant-job-changed`), utilisation
// samples draw each running job's sparkline, and alerts (e.g. budgets) show as messages.
// While the socket is down the table polls instead, and the socket reconnects by itself.
(() => {
  "use strict";
  if (!document.querySelector("[data-tenant-live]")) return;
  const html = document.documentElement;
  const POINTS = 90; // samples per sparkline
  const series = new Map(); // job id -> [utilisation %]

  function draw(svg) {
    const values = series.get(Number(svg.dataset.sparkline)) || [];
    const line = svg.querySelector("polyline");
    if (values.length < 2) {
      line.setAttribute("points", "");
      return;
    }
    const step = 90 / (POINTS - 1);
    const start = POINTS - values.length;
    line.setAttribute(
      "points",
      values.map((v, i) => `${((start + i) * step).toFixed(1)},${(21 - (v / 100) * 20).toFixed(1)}`).join(" "),
    );
    svg.setAttribute("aria-label", `GPU utilisation, last ${values.length} samples, now ${Math.round(values[values.length - 1])} %`);
  }

  function drawAll() {
    for (const svg of document.querySelectorAll("[data-sparkline]")) draw(svg);
  }

  function push(jobId, value) {
    if (value == null) return;
    const values = series.get(jobId) || [];
    values.push(value);
    if (values.length > POINTS) values.splice(0, values.length - POINTS);
    series.set(jobId, values);
  }

  async function loadRecent() {
    const since = new Date(Date.now() - 15 * 60000).toISOString();
    for (const svg of document.querySelectorAll("[data-sparkline][data-running]")) {
      const jobId = Number(svg.dataset.sparkline);
      if (series.has(jobId)) continue;
      try {
        const response = await fetch(`/api/v1/jobs/${jobId}/metrics?since=${encodeURIComponent(since)}`, {
          credentials: "same-origin",
        });
        if (!response.ok) continue;
        const data = await response.json();
        const byTime = new Map();
        for (const s of data.samples) {
          if (s.utilization == null) continue;
          const entry = byTime.get(s.at) || [];
          entry.push(s.utilization);
          byTime.set(s.at, entry);
        }
        series.set(jobId, []);
        for (const values of byTime.values()) push(jobId, values.reduce((a, b) => a + b, 0) / values.length);
        draw(svg);
      } catch (error) {
        console.warn("sparkline data unavailable", error);
      }
    }
  }

  function showAlert(message) {
    const box = document.getElementById("messages");
    if (!box) return;
    const flash = document.createElement("div");
    flash.className = `flash flash-${message.severity === "critical" ? "error" : "warning"}`;
    flash.setAttribute("role", "alert");
    flash.textContent = message.message;
    box.append(flash);
  }

  let attempts = 0;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/ws/tenant/`);
    socket.addEventListener("open", () => {
      attempts = 0;
      html.dataset.tenantSocket = "open";
    });
    socket.addEventListener("message", (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "status" || message.type === "resync") {
        document.body.dispatchEvent(new CustomEvent("gg:tenant-job-changed", { detail: message }));
      } else if (message.type === "metrics") {
        push(message.job_id, message.utilization);
        const svg = document.querySelector(`[data-sparkline="${message.job_id}"]`);
        if (svg) draw(svg);
      } else if (message.type === "alert") {
        showAlert(message);
      }
    });
    socket.addEventListener("close", () => {
      html.dataset.tenantSocket = "closed";
      attempts += 1;
      setTimeout(connect, Math.min(10000, 500 * 2 ** Math.min(attempts - 1, 5)) * (0.75 + Math.random() / 2));
    });
  }

  document.body.addEventListener("htmx:afterSwap", () => {
    drawAll();
    loadRecent();
  });
  connect();
  loadRecent();
})();
