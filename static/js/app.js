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
    const toggle = event.target.closest("[data-nav-toggle]");
    if (toggle) {
      const nav = document.getElementById(toggle.getAttribute("aria-controls"));
      const open = nav.classList.toggle("open");
      toggle.setAttribute("aria-expanded", String(open));
    }
  });
});
