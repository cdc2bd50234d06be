(function () {
  "use strict";
  // Paged tables: the first page is in the HTML; every row is JSON data (a block the browser does not run).
  // Rows are built with textContent only: node output in the data stays text.
  var tables = {};

  function el(name, className) {
    var node = document.createElement(name);
    if (className) { node.className = className; }
    return node;
  }

  function short(value) {
    var text = Number(value).toPrecision(3);
    return String(Number(text));
  }

  function sparkline(values, currentLast) {
    var ns = "http://www.w3.org/2000/svg", width = 160, height = 28;
    var svg = document.createElementNS(ns, "svg");
    svg.setAttribute("class", "sparkline");
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    var lo = Math.min.apply(null, values), hi = Math.max.apply(null, values), span = (hi - lo) || 1;
    var points = values.map(function (v, i) {
      var x = 4 + (width - 8) * (i / Math.max(1, values.length - 1));
      return [x, height - 4 - (height - 8) * (v - lo) / span];
    });
    var title = document.createElementNS(ns, "title");
    title.textContent = values.map(short).join(", ");
    var line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", points.map(function (p) { return p[0].toFixed(1) + "," + p[1].toFixed(1); }).join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", "#4a7fb5");
    line.setAttribute("stroke-width", "1.5");
    svg.appendChild(title);
    svg.appendChild(line);
    if (currentLast && points.length) {
      var mark = document.createElementNS(ns, "circle");
      mark.setAttribute("cx", points[points.length - 1][0].toFixed(1));
      mark.setAttribute("cy", points[points.length - 1][1].toFixed(1));
      mark.setAttribute("r", "3");
      mark.setAttribute("fill", "#e67e22");
      svg.appendChild(mark);
    }
    return svg;
  }

  function cell(kind, value, shared) {
    var td = el("td", kind === "num" ? "num" : "");
    if (value === null || value === undefined) { return td; }
    if (kind === "class") {
      td.className = value[1];
      td.textContent = value[0];
    } else if (kind === "link") {
      if (value[1]) {
        var a = el("a");
        a.setAttribute("href", "#node-" + value[1]);
        a.textContent = value[0];
        td.appendChild(a);
      } else {
        td.textContent = value[0];
      }
    } else if (kind === "lines") {
      value.forEach(function (line) { td.appendChild(document.createTextNode(line)); td.appendChild(el("br")); });
    } else if (kind === "code") {
      value.forEach(function (line) { var code = el("code", "cmd"); code.textContent = line; td.appendChild(code); });
    } else if (kind === "excerpt") {
      var details = el("details"), summary = el("summary"), pre = el("pre");
      summary.textContent = "output";
      pre.textContent = shared[value];
      details.appendChild(summary);
      details.appendChild(pre);
      td.appendChild(details);
    } else if (kind === "spark") {
      td.appendChild(sparkline(value[0], value[1]));
    } else {
      td.textContent = value;
    }
    return td;
  }

  function flat(value) {
    if (value === null || value === undefined) { return ""; }
    return Array.isArray(value) ? value.map(flat).join(" ") : String(value);
  }

  function load(table) {
    if (table.data) { return table.data; }
    table.data = JSON.parse(document.getElementById(table.element.getAttribute("data-paged")).textContent);
    table.text = table.data.rows.map(function (row) { return flat(row).toLowerCase(); });
    return table.data;
  }

  function matches(table, index) {
    var data = table.data, tag = table.tag, query = table.query;
    if (tag !== "all" && data.tags.length) {
      var own = data.tags[index];
      if (tag === "not-accepted" ? own === "accepted" : own !== tag) { return false; }
    }
    if (!query) { return true; }
    var keys = data.keys.length ? data.keys[index] : [];
    return keys.indexOf(table.exact) >= 0 || table.text[index].indexOf(query) >= 0;
  }

  function show(table) {
    var data = load(table), chosen = [];
    for (var i = 0; i < data.rows.length; i += 1) {
      if (matches(table, i)) { chosen.push(i); }
    }
    var pages = Math.max(1, Math.ceil(chosen.length / data.page));
    table.page = Math.min(Math.max(0, table.page), pages - 1);
    var first = table.page * data.page, shown = chosen.slice(first, first + data.page);
    var body = el("tbody");
    shown.forEach(function (index) {
      var tr = el("tr");
      if (data.tags.length) { tr.setAttribute("data-verdict", data.tags[index]); }
      data.rows[index].forEach(function (value, column) { tr.appendChild(cell(data.kinds[column], value, data.shared)); });
      body.appendChild(tr);
    });
    table.element.replaceChild(body, table.element.tBodies[0]);
    if (table.status) {
      var range = shown.length ? (first + 1) + "–" + (first + shown.length) : "0";
      var of = chosen.length === data.rows.length ? "" : " matching (of " + data.rows.length.toLocaleString("en") + ")";
      table.status.textContent = "rows " + range + " of " + chosen.length.toLocaleString("en") + of +
        ", page " + (table.page + 1) + " of " + pages;
    }
  }

  function control(pager, role) {
    return pager ? pager.querySelector("[data-role='" + role + "']") : null;
  }

  document.querySelectorAll("table[data-paged]").forEach(function (element) {
    var pager = document.querySelector("p.pager[data-for='" + element.id + "']");
    var table = { element: element, page: 0, tag: "all", query: "", exact: "", status: control(pager, "status") };
    tables[element.id] = table;
    var filter = control(pager, "filter");
    table.filter = filter;
    if (filter) {
      filter.addEventListener("input", function () {
        table.exact = filter.value.trim();
        table.query = table.exact.toLowerCase();
        table.page = 0;
        show(table);
      });
    }
    [["prev", -1], ["next", 1]].forEach(function (step) {
      var button = control(pager, step[0]);
      if (button) { button.addEventListener("click", function () { table.page += step[1]; show(table); }); }
    });
  });

  var select = document.getElementById("verdict-filter");
  if (select && tables["node-table"]) {
    select.addEventListener("change", function () {
      tables["node-table"].tag = select.value;
      tables["node-table"].page = 0;
      show(tables["node-table"]);
    });
  }

  // A node's link (#node-NAME) shows the findings of that node, folded sets included.
  function followNode() {
    var findings = tables["findings-table"];
    if (!findings || location.hash.indexOf("#node-") !== 0) { return; }
    var node = decodeURIComponent(location.hash.slice(6));
    if (findings.filter) { findings.filter.value = node; }
    findings.exact = node;
    findings.query = node.toLowerCase();
    findings.page = 0;
    show(findings);
    findings.element.scrollIntoView();
  }
  window.addEventListener("hashchange", followNode);
  followNode();
}());
