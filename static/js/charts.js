// Renders server-built Plotly figures: <div data-figure-id="x"> + <script type="application/json" id="x">
// (templates/partials/chart.html), and gives every chart its text alternative: a "Show as
// table" button that lists the chart's data in an HTML table. The job page's live charts
// (job_live.js) use the same table through window.ggCharts.
(function () {
  "use strict";
  var MAX_ROWS = 500; // a long time series: its newest rows

  // Labels a tenant chose arrive HTML-escaped for Plotly (billing/charts.py); as text here.
  function plain(text) {
    if (text == null) return "";
    text = String(text);
    if (text.indexOf("&") < 0) return text;
    return new DOMParser().parseFromString(text, "text/html").documentElement.textContent;
  }

  function shownTraces(data) {
    return (data || []).filter(function (t) {
      return t.visible !== false && t.visible !== "legendonly";
    });
  }

  function axisTitle(layout, name) {
    var axis = (layout || {})[name] || {};
    var title = axis.title;
    return plain(typeof title === "string" ? title : (title && title.text) || "");
  }

  function cell(value) {
    if (value == null || value === "") return "—";
    if (typeof value === "number") return value.toLocaleString(undefined, {maximumFractionDigits: 4});
    if (/^\d{4}-\d\d-\d\dT/.test(value)) return new Date(value).toLocaleString();
    return plain(value);
  }

  // {head: [..], rows: [[..], ..], dropped: n} from Plotly data and layout.
  function tableData(data, layout) {
    var traces = shownTraces(data);
    if (traces.length && traces[0].type === "pie") {
      var pie = traces[0];
      return {
        head: ["Name", "Amount"],
        rows: (pie.labels || []).map(function (label, i) { return [label, pie.values[i]]; }),
        dropped: 0,
      };
    }
    var keys = [];
    var index = {};
    var columns = traces.map(function (trace) {
      var horizontal = trace.orientation === "h";
      var categories = (horizontal ? trace.y : trace.x) || [];
      var values = (horizontal ? trace.x : trace.y) || [];
      var byKey = {};
      categories.forEach(function (key, i) {
        if (!(key in index)) { index[key] = keys.length; keys.push(key); }
        byKey[key] = values[i];
      });
      var axis = horizontal ? "xaxis" : "yaxis" + String(trace.yaxis || "y").slice(1);
      var unit = axisTitle(layout, axis);
      var name = plain(trace.name || "Value");
      return {head: unit && name.indexOf(unit) < 0 ? name + " (" + unit + ")" : name, byKey: byKey};
    });
    var dropped = Math.max(0, keys.length - MAX_ROWS);
    var first = traces[0] || {};
    var categoryAxis = first.orientation === "h" ? "yaxis" : "xaxis" + String(first.xaxis || "x").slice(1);
    return {
      head: [axisTitle(layout, categoryAxis) || (/^\d{4}-\d\d/.test(keys[0]) ? "Date" : "Name")].concat(
        columns.map(function (c) { return c.head; })),
      rows: keys.slice(dropped).map(function (key) {
        return [key].concat(columns.map(function (c) { return c.byKey[key]; }));
      }),
      dropped: dropped,
    };
  }

  function buildTable(container, data, layout) {
    var table = tableData(data, layout);
    var element = document.createElement("table");
    element.className = "table";
    element.dataset.testid = "chart-table";
    var caption = element.createCaption();
    caption.textContent = container.dataset.caption || axisTitle({t: layout}, "t") || "Chart data";
    if (table.dropped) caption.textContent += " (newest " + table.rows.length + " rows)";
    var headRow = element.createTHead().insertRow();
    table.head.forEach(function (text) {
      var th = document.createElement("th");
      th.scope = "col";
      th.textContent = text;
      headRow.append(th);
    });
    var body = element.createTBody();
    table.rows.forEach(function (values) {
      var row = body.insertRow();
      values.forEach(function (value, i) {
        var node = document.createElement(i === 0 ? "th" : "td");
        if (i === 0) node.scope = "row";
        else node.className = "num";
        node.textContent = cell(value);
        row.append(node);
      });
    });
    container.replaceChildren(element);
  }

  // The block's toggle shows the table of the chart `div` as drawn now (live data too).
  function wire(block, div) {
    var button = block.querySelector("[data-chart-table-toggle]");
    var container = block.querySelector("[data-chart-table]");
    if (!button || !container || button.dataset.wired) return;
    button.dataset.wired = "1";
    button.addEventListener("click", function () {
      var open = button.getAttribute("aria-expanded") !== "true";
      if (open) buildTable(container, div.data, div.layout);
      container.hidden = !open;
      button.setAttribute("aria-expanded", String(open));
      button.textContent = open ? "Hide table" : "Show as table";
    });
  }

  // A table on show is rebuilt after a live update.
  function refresh(block, div) {
    var container = block.querySelector("[data-chart-table]");
    if (container && !container.hidden) buildTable(container, div.data, div.layout);
  }

  function hasPoints(data) {
    return (data || []).some(function (trace) {
      var values = trace.type === "pie" ? trace.values : trace.orientation === "h" ? trace.x : trace.y;
      return (values || []).some(function (v) { return v != null && v !== 0; });
    });
  }

  function render(root) {
    if (!window.Plotly) return;
    root.querySelectorAll("[data-figure-id]").forEach(function (el) {
      var source = document.getElementById(el.dataset.figureId);
      if (!source) return;
      var figure = JSON.parse(source.textContent);
      Plotly.react(el, figure.data, figure.layout, {responsive: true, displaylogo: false});
      var block = el.closest("[data-chart-block]");
      if (block) wire(block, el);
    });
  }

  window.ggCharts = {wire: wire, refresh: refresh, hasPoints: hasPoints, tableData: tableData};
  document.addEventListener("DOMContentLoaded", function () { render(document); });
  document.addEventListener("htmx:afterSettle", function (event) { render(event.target); });
})();
