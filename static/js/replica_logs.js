// A replica's log, live (/ws/services/<id>/replicas/<replica id>/logs/): the socket sends
// the latest lines, then what is new each second with the replica's state, until it has
// stopped. While the socket is down the block polls instead (its htmx trigger checks
// `data-replica-socket`), and the socket reconnects by itself.
(() => {
  "use strict";
  const html = document.documentElement;
  const MAX_LINES = 5000;
  const block = () => document.getElementById("replica-log");
  const first = block();
  if (!first || !first.dataset.replicaSocket) return;
  const url = first.dataset.replicaSocket;

  function show(message, fresh) {
    const box = block();
    if (!box) return;
    const badge = box.querySelector("[data-testid=replica-state]");
    if (badge) {
      badge.textContent = message.state.charAt(0).toUpperCase() + message.state.slice(1);
      badge.className = `badge badge-${message.state}`;
    }
    const reason = box.querySelector("[data-replica-reason]");
    if (reason) reason.textContent = message.reason ? ` ${message.reason}` : "";
    const warning = box.querySelector("[data-replica-error]");
    if (warning) {
      warning.textContent = message.error;
      warning.hidden = !message.error;
    }
    let pre = box.querySelector("pre.log");
    if (!message.lines.length && !fresh) return;
    if (!pre) {
      pre = document.createElement("pre");
      pre.className = "log";
      pre.dataset.testid = "replica-log";
      pre.tabIndex = 0; // a scrollable region is reachable from the keyboard
      pre.setAttribute("aria-label", "Replica log");
      box.append(pre);
    }
    const empty = box.querySelector("[data-testid=replica-log-empty]");
    if (empty && message.lines.length) empty.remove();
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    const text = message.lines.map((line) => `${line}\n`).join("");
    if (fresh) pre.textContent = text;
    else pre.append(text);
    const lines = pre.textContent.split("\n");
    if (lines.length > MAX_LINES + 1) pre.textContent = lines.slice(-MAX_LINES - 1).join("\n");
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  }

  let attempts = 0;
  let stopped = false;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}${url}`);
    let fresh = true;
    socket.addEventListener("open", () => {
      attempts = 0;
      html.dataset.replicaSocket = "open";
    });
    socket.addEventListener("message", (event) => {
      const message = JSON.parse(event.data);
      if (message.type !== "replica_log") return;
      show(message, fresh);
      fresh = false;
      stopped = message.state === "stopped";
    });
    socket.addEventListener("close", (event) => {
      html.dataset.replicaSocket = "closed";
      // Stopped, gone, or not allowed: nothing more will come.
      if (stopped || event.code === 4403 || event.code === 4404) return;
      attempts += 1;
      setTimeout(connect, Math.min(10000, 500 * 2 ** Math.min(attempts - 1, 5)) * (0.75 + Math.random() / 2));
    });
  }
  connect();
})();
