-- A fixed Lua workload for tools/bench_regalloc.py: four programs of the Computer Language
-- Benchmarks Game (binary-trees, fannkuch-redux, n-body, spectral-norm) at small sizes, plus
-- string work. Deterministic; prints one checksum line so a wrong interpreter is caught.

local function bottom_up_tree(depth)
  if depth > 0 then
    depth = depth - 1
    return { bottom_up_tree(depth), bottom_up_tree(depth) }
  end
  return {}
end

local function item_check(tree)
  if tree[1] then return 1 + item_check(tree[1]) + item_check(tree[2]) end
  return 1
end

local function binary_trees(n)
  local total = 0
  for depth = 4, n, 2 do
    local iterations = 2 ^ (n - depth + 4)
    for _ = 1, iterations do total = total + item_check(bottom_up_tree(depth)) end
  end
  return total
end

local function fannkuch(n)
  local perm, perm1, count = {}, {}, {}
  local maxflips, checksum, r, nperm = 0, 0, n, 0
  for i = 0, n - 1 do perm1[i] = i end
  while true do
    while r ~= 1 do count[r - 1] = r; r = r - 1 end
    for i = 0, n - 1 do perm[i] = perm1[i] end
    local flips = 0
    local k = perm[0]
    while k ~= 0 do
      local i, j = 0, k
      while i < j do perm[i], perm[j] = perm[j], perm[i]; i = i + 1; j = j - 1 end
      flips = flips + 1
      k = perm[0]
    end
    if flips > maxflips then maxflips = flips end
    checksum = checksum + (nperm % 2 == 0 and flips or -flips)
    while true do
      if r == n then return checksum, maxflips end
      local perm0 = perm1[0]
      for i = 0, r - 1 do perm1[i] = perm1[i + 1] end
      perm1[r] = perm0
      count[r] = count[r] - 1
      if count[r] > 0 then break end
      r = r + 1
    end
    nperm = nperm + 1
  end
end

local function nbody(steps)
  local pi, days = math.pi, 365.24
  local sm = 4 * pi * pi
  local bodies = {
    { 0, 0, 0, 0, 0, 0, sm },
    { 4.84143144246472090e+00, -1.16032004402742839e+00, -1.03622044471123109e-01,
      1.66007664274403694e-03 * days, 7.69901118419740425e-03 * days,
      -6.90460016972063023e-05 * days, 9.54791938424326609e-04 * sm },
    { 8.34336671824457987e+00, 4.12479856412430479e+00, -4.03523417114321381e-01,
      -2.76742510726862411e-03 * days, 4.99852801234917238e-03 * days,
      2.30417297573763929e-05 * days, 2.85885980666130812e-04 * sm },
    { 1.28943695621391310e+01, -1.51111514016986312e+01, -2.23307578892655734e-01,
      2.96460137564761618e-03 * days, 2.37847173959480950e-03 * days,
      -2.96589568540237556e-05 * days, 4.36624404335156298e-05 * sm },
    { 1.53796971148509165e+01, -2.59193146099879641e+01, 1.79258772950371181e-01,
      2.68067772490389322e-03 * days, 1.62824170038242295e-03 * days,
      -9.51592254519715870e-05 * days, 5.15138902046611451e-05 * sm },
  }
  local n = #bodies
  for _ = 1, steps do
    for i = 1, n do
      local bi = bodies[i]
      for j = i + 1, n do
        local bj = bodies[j]
        local dx, dy, dz = bi[1] - bj[1], bi[2] - bj[2], bi[3] - bj[3]
        local d2 = dx * dx + dy * dy + dz * dz
        local mag = 0.01 / (d2 * math.sqrt(d2))
        local bm, bjm = bi[7] * mag, bj[7] * mag
        bi[4], bi[5], bi[6] = bi[4] - dx * bjm, bi[5] - dy * bjm, bi[6] - dz * bjm
        bj[4], bj[5], bj[6] = bj[4] + dx * bm, bj[5] + dy * bm, bj[6] + dz * bm
      end
    end
    for i = 1, n do
      local b = bodies[i]
      b[1], b[2], b[3] = b[1] + 0.01 * b[4], b[2] + 0.01 * b[5], b[3] + 0.01 * b[6]
    end
  end
  return bodies[1][1]
end

local function spectral_norm(n)
  local function a(i, j)
    local ij = i + j - 1
    return 1.0 / (ij * (ij - 1) * 0.5 + i)
  end
  local function av(x, y)
    for i = 1, n do
      local s = 0
      for j = 1, n do s = s + a(i, j) * x[j] end
      y[i] = s
    end
  end
  local function atv(x, y)
    for i = 1, n do
      local s = 0
      for j = 1, n do s = s + a(j, i) * x[j] end
      y[i] = s
    end
  end
  local u, v, t = {}, {}, {}
  for i = 1, n do u[i] = 1 end
  for _ = 1, 10 do
    av(u, t); atv(t, v); av(v, t); atv(t, u)
  end
  local vbv, vv = 0, 0
  for i = 1, n do vbv = vbv + u[i] * v[i]; vv = vv + v[i] * v[i] end
  return math.sqrt(vbv / vv)
end

local function strings(n)
  local parts = {}
  for i = 1, n do parts[#parts + 1] = string.format("%d:%x;", i, i * 2654435761 % 4294967296) end
  local s = table.concat(parts)
  local count = 0
  for a, b in s:gmatch("(%d+):(%x+);") do count = count + #a + #b end
  return count + #s:gsub("[0-9]", "")
end

local trees = binary_trees(12)
local fk, flips = fannkuch(8)
local x = nbody(40000)
local sn = spectral_norm(120)
local st = strings(30000)
print(string.format("%d %d %d %.9f %.9f %d", trees, fk, flips, x, sn, st))
