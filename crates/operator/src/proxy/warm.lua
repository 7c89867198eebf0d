-- The warm-up route of memcached-operator (a start file of the proxy, loaded after
-- memcached's route library in the configuration VM and in every worker). Static: the
-- operator writes it unchanged; what is warmed from where is in config.lua.
--
-- route_warm{ child = "pool", child_warm = "warm", meta = bool } reads a key from the pod
-- that holds its slot now ("pool"). On a miss or an error there it reads the same key from
-- the pod that held the slot before ("warm", a ring of the same length whose other slots
-- are down), answers with that pod's value, and writes the value back to the new pod as an
-- add (`ms ... ME`), so a value the new pod got meanwhile is never overwritten. The write-back
-- is not awaited. `meta = true` marks the route of meta reads (`mg`): those with base64
-- keys are not warmed.
--
-- With `child_unmoved` (a scale-out: "warm" is the ring as it was before it grew), only
-- the keys that moved to a new slot are warmed: "unmoved" is the current ring with every
-- slot the scale-out added down. A key that did not move is read through it, from its own
-- pod, and that answer (a hit, a miss) is final. A key that moved gets an error from it at
-- once, without a request, and goes through "pool" (its new pod) and "warm" as above. A
-- key whose own pod fails gets an error too and then fails again through "pool".
--
-- route_warm_write{ child = "pool", child_warm = "warm", child_unmoved = "unmoved" } sends
-- a write through "unmoved": a key that did not move is written there once, to its own pod
-- (were it written through both rings, its pod would apply an incr, a decr, an append or a
-- prepend twice). On an error (the key moved, or its pod fails) the write goes to the pod
-- that held the key before, then to its new pod, whose answer the client gets: a failing
-- new pod never leaves the former pod with a value older than the write. A key whose own
-- pod fails is written to that pod through both, and fails through both. Not atomic: a
-- read of a moved key between the two writes may copy the former pod's changed value to
-- the new pod before the write reaches it.
--
-- Must never raise an error while loading: a start file that fails stops memcached.
register_route_handlers({ "warm", "warm_write" })

function route_warm_conf(t, ctx)
    return t
end

-- With an unmoved ring: the answer of a key that did not move, from its own pod; nil for
-- a key that moved or whose pod failed.
local function unmoved_answer(rctx, o, r)
    if o.unmoved then
        local own = rctx:enqueue_and_wait(r, o.unmoved)
        if own ~= nil and own:ok() then
            return own
        end
    end
    return nil
end

local function route_warm_f(rctx, o)
    return function(r)
        local own = unmoved_answer(rctx, o, r)
        if own ~= nil then
            return own
        end
        local res = rctx:enqueue_and_wait(r, o.new)
        if res:hit() or (o.is_meta and r:has_flag("b")) then
            return res
        end
        -- The client's own request, for its answer, and a meta read of the value with its
        -- flags and remaining TTL, for the write-back.
        local peek = mcp.request("mg " .. r:key() .. " v f t\r\n")
        rctx:enqueue(r, o.old)
        rctx:enqueue(peek, o.peek)
        rctx:wait_cond(2)
        local m = rctx:result(o.peek)
        if m ~= nil and m:hit() then
            local line = " " .. (m:line() or "")
            local flags = line:match(" f(%d+)") or "0"
            local ttl = tonumber(line:match(" t(%-?%d+)") or "0") or 0
            if ttl < 0 then
                ttl = 0
            end
            local add = mcp.request(
                string.format("ms %s %d F%s T%d ME\r\n", r:key(), m:vlen(), flags, ttl),
                m
            )
            rctx:enqueue(add, o.fill)
            rctx:wait_cond(0)
        end
        local w = rctx:result(o.old)
        if w ~= nil and w:hit() then
            return w
        end
        return res
    end
end

function route_warm_start(a, ctx, fgen)
    local o = {
        new = fgen:new_handle(a.child),
        fill = fgen:new_handle(a.child),
        old = fgen:new_handle(a.child_warm),
        peek = fgen:new_handle(a.child_warm),
        is_meta = a.meta,
    }
    if a.child_unmoved then
        o.unmoved = fgen:new_handle(a.child_unmoved)
    end
    fgen:ready({ a = o, n = ctx:label(), f = route_warm_f })
end

function route_warm_write_conf(t, ctx)
    return t
end

local function route_warm_write_f(rctx, o)
    return function(r)
        local own = unmoved_answer(rctx, o, r)
        if own ~= nil then
            return own
        end
        rctx:enqueue_and_wait(r, o.old)
        return rctx:enqueue_and_wait(r, o.new)
    end
end

function route_warm_write_start(a, ctx, fgen)
    local o = {
        new = fgen:new_handle(a.child),
        old = fgen:new_handle(a.child_warm),
    }
    if a.child_unmoved then
        o.unmoved = fgen:new_handle(a.child_unmoved)
    end
    fgen:ready({ a = o, n = ctx:label(), f = route_warm_write_f })
end
