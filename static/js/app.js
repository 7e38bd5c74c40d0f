// Small progressive enhancements; every page works without them.
document.addEventListener("DOMContentLoaded", () => {
  document.body.addEventListener("change", (event) => {
    const select = event.target.closest("select[data-autosubmit]");
    if (select && select.form) select.form.requestSubmit();
  });
  document.body.addEventListener("click", (event) => {
    const copyButton = event.target.closest("[data-copy]");
    if (copyButton) {
      const input = document.querySelector(copyButton.dataset.copy);
      if (input) {
        input.select();
        navigator.clipboard?.writeText(input.value).then(() => { copyButton.textContent = "Copied"; });
      }
    }
    const use = event.target.closest("[data-recommend-use]");
    if (use) fillFromRecommendation(use);
    const toggle = event.target.closest("[data-nav-toggle]");
    if (toggle) {
      const nav = document.getElementById(toggle.getAttribute("aria-controls"));
      const open = nav.classList.toggle("open");
      toggle.setAttribute("aria-expanded", String(open));
    }
  });
  keyboardScrollBoxes();
  window.addEventListener("resize", keyboardScrollBoxes);
  document.body.addEventListener("htmx:afterSettle", keyboardScrollBoxes);
});

// A table or log that scrolls (a wide table on a phone) and holds nothing focusable joins
// the tab order while it scrolls, so the keyboard can scroll it too (WCAG 2.1.1).
function keyboardScrollBoxes() {
  for (const box of document.querySelectorAll(".table, .table-scroll, .chart-table, pre.log")) {
    const scrolls = box.scrollWidth > box.clientWidth || box.scrollHeight > box.clientHeight;
    const owned = box.hasAttribute("data-scroll-focus");
    if (scrolls && !box.hasAttribute("tabindex") && !box.querySelector("a[href], button, input, select, textarea, [tabindex]")) {
      box.setAttribute("tabindex", "0");
      box.setAttribute("data-scroll-focus", "");
    } else if (!scrolls && owned) {
      box.removeAttribute("tabindex");
      box.removeAttribute("data-scroll-focus");
    }
  }
}

// The GPU recommender's "Use": fill the page's launch (or estimate) form with the chosen
// configuration, then fire "change" so its image list and live estimate follow.
function fillFromRecommendation(button) {
  const panel = button.closest("[data-recommend-fills]");
  const form = panel && panel.dataset.recommendFills && document.querySelector(panel.dataset.recommendFills);
  if (!form) return;
  const values = {
    gpu_type: button.dataset.gpuType,
    gpus_per_node: button.dataset.gpusPerNode,
    nodes: button.dataset.nodes,
    region: button.dataset.region,
    tier: button.dataset.tier,
    spot_ratio: button.dataset.tier === "spot" ? "1" : "0",
  };
  const dependent = form.querySelector("[data-launch-options]");
  if (dependent && window.htmx) {
    // The launch form's region and GPUs-per-node lists follow the GPU type: the server
    // resolves the recommendation into them (one request), so set only the free fields.
    for (const name of ["gpu_type", "nodes", "spot_ratio"]) {
      const field = form.elements.namedItem(name);
      if (field) field.value = values[name];
    }
    const params = {};
    for (const field of document.querySelectorAll("[data-launch-choice]")) {
      if (field.name) params[field.name] = field.value;
    }
    const { tier, ...asked } = values;
    window.htmx.ajax("GET", dependent.getAttribute("hx-get"), {
      target: "#launch-capacity", swap: "outerHTML",
      values: { ...params, ...asked, changed: "gpu_type" },
    });
    button.textContent = "Filled in";
    return;
  }
  for (const [name, value] of Object.entries(values)) {
    const field = form.elements.namedItem(name);
    if (!field || field.type === "hidden" || value === undefined) continue;
    field.value = value;
    // `input` is what the estimate form's htmx trigger listens to (not `change`: the
    // blur of a click on "Launch this" would swap the link away mid-click).
    field.dispatchEvent(new Event("input", { bubbles: true }));
    field.dispatchEvent(new Event("change", { bubbles: true }));
  }
  const first = form.elements.namedItem("gpu_type");
  if (first && first.focus) first.focus();
  button.textContent = "Filled in";
}
