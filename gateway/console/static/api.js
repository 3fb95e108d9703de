// Calls to the gateway's JSON views. The admin key lives only in this module's memory:
// never in storage, cookies or the URL, and it is gone when the page is closed.

let adminKey = null;

export function setAdminKey(key) {
  adminKey = key ? key : null;
}

export function hasAdminKey() {
  return adminKey !== null;
}

/** An error answered in the gateway's envelope {"error": {message, type, param, code}}. */
export class ApiError extends Error {
  constructor(status, error) {
    super(error?.message || `HTTP ${status}`);
    this.status = status;
    this.type = error?.type ?? null;
    this.param = error?.param ?? null;
    this.code = error?.code ?? null;
  }
}

export async function errorFrom(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  return new ApiError(response.status, body?.error);
}

function adminHeaders() {
  return adminKey ? { Authorization: `Bearer ${adminKey}` } : {};
}

async function call(method, path, timeoutMs) {
  const response = await fetch(path, {
    method,
    headers: adminHeaders(),
    signal: AbortSignal.timeout(timeoutMs),
    cache: "no-store",
  });
  if (!response.ok) {
    throw await errorFrom(response);
  }
  return response.json();
}

export function adminGet(path) {
  return call("GET", path, 8000);
}

/** Load and unload wait for the model (a load can take minutes). */
export function adminPost(path) {
  return call("POST", path, 15 * 60 * 1000);
}

export function describeError(error) {
  if (error instanceof ApiError) {
    const where = error.param ? ` (param: ${error.param})` : "";
    return `${error.status} ${error.type ?? "error"}${where}: ${error.message}`;
  }
  if (error?.name === "TimeoutError") {
    return "the gateway did not answer in time";
  }
  return error?.message || String(error);
}
