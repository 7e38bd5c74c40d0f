// Renders server-built Plotly figures: <div data-figure-id="x"> + <script type="application/json" id="x">.
(function () {
  function render(root) {
    if (!window.Plotly) return;
    root.querySelectorAll("[data-figure-id]").forEach(function (el) {
      var source = document.getElementById(el.dataset.figureId);
      if (!source) return;
      var figure = JSON.parse(source.textContent);
      Plotly.react(el, figure.data, figure.layout, {responsive: true, displaylogo: false});
    });
  }
  document.addEventListener("DOMContentLoaded", function () { render(document); });
  document.addEventListener("htmx:afterSettle", function (event) { render(event.target); });
})();
