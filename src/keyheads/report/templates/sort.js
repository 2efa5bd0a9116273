// Click a header to sort by that column; numeric cells sort by their exact value (data-sort).
document.querySelectorAll("table.sortable").forEach(function (tbl) {
  var heads = tbl.querySelectorAll("thead th");
  heads.forEach(function (th, col) {
    th.addEventListener("click", function () {
      var asc = !th.classList.contains("asc");
      heads.forEach(function (h) { h.classList.remove("asc", "desc"); });
      th.classList.add(asc ? "asc" : "desc");
      var body = tbl.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      function key(row) {
        var td = row.cells[col];
        if (!td) { return ""; }
        var v = td.getAttribute("data-sort");
        return v === null ? td.textContent : parseFloat(v);
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        var r = (typeof x === "number" && typeof y === "number") ? x - y : String(x).localeCompare(String(y));
        return asc ? r : -r;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
