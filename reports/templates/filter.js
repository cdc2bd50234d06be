(function () {
  "use strict";
  var select = document.getElementById("verdict-filter");
  var table = document.getElementById("node-table");
  if (!select || !table) { return; }
  select.addEventListener("change", function () {
    var wanted = select.value;
    var rows = table.querySelectorAll("tbody tr");
    var shown = 0;
    rows.forEach(function (row) {
      var show = wanted === "all" || row.getAttribute("data-verdict") === wanted ||
        (wanted === "not-accepted" && row.getAttribute("data-verdict") !== "accepted");
      row.hidden = !show;
      if (show) { shown += 1; }
    });
    document.getElementById("node-count").textContent = shown + " of " + rows.length + " nodes";
  });
  select.dispatchEvent(new Event("change"));
}());
