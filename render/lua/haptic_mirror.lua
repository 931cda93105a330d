-- haptic's request mirror, loaded by `lua-load-per-thread` when some route mirrors requests.
--
-- `http-request lua.haptic_mirror <backend>` copies the request as it stands at that rule (its
-- method, path and query, headers, and body) and hands the copy to a task of its own, which
-- sends it to the `haptic_mirror` frontend on the abstract socket that `global` names in
-- HAPTIC_MIRROR_SOCKET; that frontend passes it to <backend>. The action returns at once: the request itself never waits for its copy, and what
-- the copy's backend answers is dropped. It must never change the request it copies.
--
-- A request is copied only when it is whole: no body, or a Content-Length body that has all
-- arrived (HAProxy does not wait for a body here, and a copy with part of a body would be a
-- different request). At most MAX_IN_FLIGHT copies per thread are on their way at once; past
-- that, requests are not copied until some finish.

local MAX_IN_FLIGHT = 256
local TIMEOUT_MS = 10000
local SOCKET = os.getenv("HAPTIC_MIRROR_SOCKET")

-- Headers of one hop, and the ones the client that sends the copy writes itself.
local NOT_COPIED = {
  ["connection"] = true, ["keep-alive"] = true, ["proxy-connection"] = true, ["te"] = true,
  ["trailer"] = true, ["transfer-encoding"] = true, ["upgrade"] = true, ["expect"] = true,
  ["content-length"] = true, ["x-haptic-mirror"] = true, ["x-haptic-mirror-method"] = true,
}

local in_flight = 0

-- The request's headers as the HTTP client takes them (name -> list of values), without the
-- ones above.
local function copied_headers(txn)
  local out = {}
  for name, values in pairs(txn.http:req_get_headers()) do
    if not NOT_COPIED[name] then
      local list = {}
      for i = 0, #values do
        if values[i] ~= nil then list[#list + 1] = values[i] end
      end
      out[name] = list
    end
  end
  return out
end

-- The body to copy ("" for none), or nil when the request is not whole yet.
local function whole_body(txn)
  if txn.f:req_hdr_cnt("transfer-encoding") > 0 then
    return nil
  end
  local size = txn.f:req_body_size() or 0
  if size == 0 then
    return ""
  end
  if (txn.f:req_body_len() or 0) ~= size then
    return nil
  end
  return txn.f:req_body() or ""
end

core.register_action("haptic_mirror", { "http-req" }, function(txn, backend)
  if in_flight >= MAX_IN_FLIGHT then
    return
  end
  local body = whole_body(txn)
  if body == nil then
    return
  end
  local headers = copied_headers(txn)
  headers["x-haptic-mirror"] = { backend }
  headers["x-haptic-mirror-method"] = { txn.sf:method() }
  local request = {
    url = "http://haptic-mirror" .. txn.sf:pathq(),
    dst = SOCKET,
    headers = headers,
    timeout = TIMEOUT_MS,
  }
  in_flight = in_flight + 1
  core.register_task(function()
    pcall(function()
      local client = core.httpclient()
      if body == "" then
        client:get(request)
      else
        -- HAProxy 3.x's client sends the body chunked whatever this says; 2.6 and 3.0 keep it.
        request.headers["content-length"] = { tostring(#body) }
        request.body = body
        client:post(request)
      end
    end)
    in_flight = in_flight - 1
  end)
end, 1)
