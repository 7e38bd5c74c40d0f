// Feedback while something is in flight. The bar at the top of the page (base layout,
// `hx-indicator` on <body>) shows for every htmx request; the region being replaced is
// marked aria-busy (dimmed by app.css) so stale content doesn't read as the answer; a
// submitted form's buttons are disabled with a busy label until the answer comes.
(() => {
  const BUSY_LABEL = "Working…";

  function submitButtons(form) {
    const inside = Array.from(form.querySelectorAll("button:not([type=button]):not([type=reset]), input[type=submit]"));
    const outside = form.id ? Array.from(document.querySelectorAll(`[form="${CSS.escape(form.id)}"]`)) : [];
    return inside.concat(outside.filter((el) => el.matches("button, input[type=submit]")));
  }

  function label(button, text) {
    if (button.tagName === "INPUT") button.value = text; else button.textContent = text;
  }

  function markBusy(form, submitter) {
    if (form.hasAttribute("data-no-busy") || form.dataset.busy === "true") return;
    form.dataset.busy = "true";
    form.setAttribute("aria-busy", "true");
    for (const button of submitButtons(form)) {
      if (button.disabled) continue;
      button.dataset.idleLabel = button.tagName === "INPUT" ? button.value : button.textContent;
      button.dataset.busyDisabled = "true";
      button.disabled = true;
      if (button === submitter || !submitter) label(button, button.dataset.busyLabel || BUSY_LABEL);
    }
  }

  function markIdle(form) {
    delete form.dataset.busy;
    form.removeAttribute("aria-busy");
    for (const button of submitButtons(form)) {
      if (button.dataset.busyDisabled !== "true") continue;
      button.disabled = false;
      label(button, button.dataset.idleLabel);
      delete button.dataset.busyDisabled;
      delete button.dataset.idleLabel;
    }
  }

  // Ordinary submits: disable after the event, or the submitter's name=value (a form
  // with several actions) would be left out of what the browser sends.
  document.addEventListener("submit", (event) => {
    const form = event.target;
    // htmx handles (and prevents) its forms' submits: those are covered below.
    // A form answered in another tab or frame leaves this page as it is.
    if (event.defaultPrevented || (form.target && form.target !== "_self")) return;
    const submitter = event.submitter;
    setTimeout(() => markBusy(form, submitter), 0);
    // A GET form may answer with a download, leaving this page in place.
    if ((form.method || "get").toLowerCase() === "get") setTimeout(() => markIdle(form), 5000);
  });

  // Back/forward cache: the page comes back as it was left, buttons disabled.
  window.addEventListener("pageshow", (event) => {
    if (event.persisted) document.querySelectorAll("form[data-busy=true]").forEach(markIdle);
  });

  document.addEventListener("htmx:beforeRequest", (event) => {
    const { elt, target } = event.detail;
    if (target && target !== document.body) target.setAttribute("aria-busy", "true");
    const form = elt.closest("form");
    if (form && (elt === form || elt.matches("button, input[type=submit]"))) {
      markBusy(form, event.detail.requestConfig?.triggeringEvent?.submitter || null);
    }
  });

  document.addEventListener("htmx:afterRequest", (event) => {
    const { elt, target } = event.detail;
    if (target) target.removeAttribute("aria-busy");
    const form = elt.closest("form");
    if (form) markIdle(form);
  });
})();
