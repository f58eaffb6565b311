// A test upstream for idem-proxy in Node, its own `http` module only: it counts the effects it
// makes.   node upstream.js PORT   (0: any free port; the first line printed says which)
//
// POST /orders[?delay_ms=N]  201, JSON, X-Order-Id, Set-Cookie, the Idempotency-Key it got
// GET  /count                {"runs": N}
"use strict";
const http = require("http");

let runs = 0;

const server = http.createServer((req, res) => {
  const url = new URL(req.url, "http://upstream");
  if (req.method === "GET" && url.pathname === "/count") {
    res.writeHead(200, { "Content-Type": "application/json" });
    res.end(JSON.stringify({ runs }));
    return;
  }
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const delay = Number(url.searchParams.get("delay_ms") || 0);
    setTimeout(() => {
      runs += 1;
      const n = runs;
      const body = JSON.stringify({
        id: n,
        key: req.headers["idempotency-key"] || "",
        body: Buffer.concat(chunks).toString("utf8"),
      });
      res.writeHead(201, {
        "Content-Type": "application/json",
        "X-Order-Id": `ord_${n}`,
        "Set-Cookie": `session=n${n}`,
      });
      res.end(body);
    }, delay);
  });
});

server.listen(Number(process.argv[2] || 0), "127.0.0.1", () => {
  console.log(`listening ${server.address().port}`);
});
