// Renders /openapi.json as a list of operations. Served by the service itself (no CDN) and
// loaded as an external script, so it runs under the service's Content-Security-Policy.
// Every text from the document is inserted with textContent, never as HTML.
"use strict";

const METHODS = ["get", "post", "put", "patch", "delete"];

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function resolve(doc, schema) {
  let current = schema;
  for (let depth = 0; current && current.$ref && depth < 10; depth += 1) {
    const parts = current.$ref.replace(/^#\//, "").split("/");
    current = parts.reduce((node, key) => (node ? node[key] : undefined), doc);
  }
  return current || {};
}

function schemaBlock(doc, schema) {
  return el("pre", JSON.stringify(resolve(doc, schema), null, 2));
}

function securityText(doc, operation) {
  const security = operation.security !== undefined ? operation.security : doc.security;
  if (!security || security.length === 0) return "no authentication";
  return "auth: " + security.map((req) => Object.keys(req).join(" + ") || "none").join(" or ");
}

function renderOperation(doc, path, method, operation, index) {
  const section = el("section", null, "operation");
  section.id = "op-" + index;
  const heading = el("h2");
  heading.append(el("span", method, "method " + method), el("span", path, "path"));
  section.append(heading, el("p", operation.summary || ""), el("p", securityText(doc, operation), "auth"));
  if (operation.description) section.append(el("p", operation.description));

  const parameters = (operation.parameters || []).map((p) => resolve(doc, p));
  if (parameters.length) {
    const table = el("table");
    const head = el("tr");
    ["parameter", "in", "required", "description"].forEach((h) => head.append(el("th", h)));
    table.append(head);
    parameters.forEach((p) => {
      const row = el("tr");
      [p.name, p.in, p.required ? "yes" : "no", p.description || ""].forEach((v) => row.append(el("td", v)));
      table.append(row);
    });
    section.append(table);
  }

  const body = operation.requestBody ? resolve(doc, operation.requestBody) : null;
  if (body && body.content) {
    Object.entries(body.content).forEach(([type, media]) => {
      section.append(el("h3", "Request body (" + type + ")"), schemaBlock(doc, media.schema));
    });
  }

  const responses = el("table");
  const head = el("tr");
  ["status", "description"].forEach((h) => head.append(el("th", h)));
  responses.append(head);
  Object.entries(operation.responses || {}).forEach(([status, response]) => {
    const row = el("tr");
    row.append(el("td", status), el("td", resolve(doc, response).description || ""));
    responses.append(row);
  });
  section.append(el("h3", "Responses"), responses);
  return section;
}

function render(doc) {
  document.getElementById("title").textContent = (doc.info && doc.info.title) || "API reference";
  document.getElementById("summary").textContent =
    ((doc.info && doc.info.description) || "") + " (OpenAPI " + doc.openapi + ")";
  const toc = el("ul");
  const main = document.getElementById("paths");
  let index = 0;
  Object.entries(doc.paths || {}).forEach(([path, item]) => {
    METHODS.forEach((method) => {
      if (!item[method]) return;
      index += 1;
      const link = el("a", method.toUpperCase() + " " + path);
      link.href = "#op-" + index;
      const entry = el("li");
      entry.append(link);
      toc.append(entry);
      main.append(renderOperation(doc, path, method, item[method], index));
    });
  });
  document.getElementById("toc").append(toc);
}

fetch("/openapi.json", { credentials: "same-origin" })
  .then((response) => {
    if (!response.ok) throw new Error("HTTP " + response.status);
    return response.json();
  })
  .then(render)
  .catch((error) => {
    const summary = document.getElementById("summary");
    summary.textContent = "Could not load /openapi.json: " + error.message;
    summary.className = "error";
  });
