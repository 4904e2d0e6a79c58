// Many node-postgres clients at once through a leafproxy transaction pool smaller than
// the client count. Every client connects first, so that all sessions are open together;
// then each inserts rows without an ID (the proxy fills the key) and asks for IDs with
// leaf_next, in simple queries, parameterised queries and named prepared statements used
// across transactions, a named statement failing outside and inside a transaction, and
// LISTEN and a session advisory lock refused with 0A000.
// Prints "row <id>" for each row it committed, "gone <id>" for each
// row of a transaction it rolled back and "next <id>" for each bare leaf_next ID.
//
// Usage: DATABASE_URL=postgres://user:pw@127.0.0.1:6432/db TABLE=t TAG=order CLIENTS=50 ROUNDS=4 node txpool.js
'use strict';

const { Client } = require('pg');

function ident(name, value) {
  if (!/^[a-z_][a-z0-9_]*$/.test(value || '')) {
    throw new Error(`${name} must be a plain identifier, got ${JSON.stringify(value)}`);
  }
  return value;
}

function count(name, fallback) {
  const n = Number(process.env[name] || fallback);
  if (!Number.isInteger(n) || n < 1) {
    throw new Error(`${name} must be a positive integer`);
  }
  return n;
}

function id(value) {
  // int8 arrives as a string: check it is an integer.
  const s = String(value);
  if (!/^[1-9][0-9]*$/.test(s)) {
    throw new Error(`not an ID: ${JSON.stringify(value)}`);
  }
  return s;
}

// expectCode waits for a query that must fail with the SQLSTATE code.
async function expectCode(query, code, what) {
  let err = null;
  try {
    await query;
  } catch (e) {
    err = e;
  }
  if (!err || err.code !== code) {
    throw new Error(`${what}: got ${err ? `${err.code} ${err.message}` : 'no error'}, want SQLSTATE ${code}`);
  }
}

// work runs one client's rounds and returns the lines it has to print.
async function work(client, n, table, tag, rounds) {
  const out = [];
  const who = `node ${n}`;
  const insert = `INSERT INTO ${table} (client, note) VALUES ($1, $2) RETURNING id`;
  // A named statement: node-postgres parses it once per session and afterwards only
  // binds it, on whatever server connection the pool lends this round.
  const named = (note) => ({ name: 'txpool-insert', text: insert, values: [who, note] });
  const namedNext = { name: 'txpool-next', text: 'SELECT leaf_next($1, $2) AS id', values: [tag, 2] };
  for (let r = 0; r < rounds; r++) {
    // Outside a transaction: each statement is one.
    let res = await client.query(`INSERT INTO ${table} (client, note) VALUES ('${who}', 'simple ${r}') RETURNING id`);
    out.push(`row ${id(res.rows[0].id)}`);
    res = await client.query(insert, [who, `extended ${r}`]);
    out.push(`row ${id(res.rows[0].id)}`);
    res = await client.query(named(`named ${r}`));
    out.push(`row ${id(res.rows[0].id)}`);
    res = await client.query(`SELECT leaf_next('${tag}') AS id`);
    out.push(`next ${id(res.rows[0].id)}`);
    res = await client.query('SELECT leaf_next($1) AS id', [tag]);
    out.push(`next ${id(res.rows[0].id)}`);
    res = await client.query(namedNext);
    if (res.rows.length !== 2) {
      throw new Error(`leaf_next($1, 2) gave ${res.rows.length} rows`);
    }
    for (const row of res.rows) {
      out.push(`next ${id(row.id)}`);
    }

    // A transaction: every protocol inside it, on the one server connection it holds.
    await client.query('BEGIN');
    const mine = [];
    res = await client.query(`INSERT INTO ${table} (client, note) VALUES ('${who}', 'tx simple ${r}') RETURNING id`);
    mine.push(id(res.rows[0].id));
    res = await client.query(insert, [who, `tx extended ${r}`]);
    mine.push(id(res.rows[0].id));
    res = await client.query(named(`tx named ${r}`));
    mine.push(id(res.rows[0].id));
    res = await client.query(namedNext);
    for (const row of res.rows) {
      out.push(`next ${id(row.id)}`);
    }
    // Its own rows are visible to it inside the transaction.
    res = await client.query(`SELECT count(*) AS n FROM ${table} WHERE id = ANY($1::int8[])`, [mine]);
    if (Number(res.rows[0].n) !== mine.length) {
      throw new Error(`${who}: sees ${res.rows[0].n} of its ${mine.length} rows inside its transaction`);
    }
    // Every other round is rolled back: its rows must not be stored.
    const keep = r % 2 === 0;
    await client.query(keep ? 'COMMIT' : 'ROLLBACK');
    for (const m of mine) {
      out.push(`${keep ? 'row' : 'gone'} ${m}`);
    }

    // A named statement that fails when it runs: the error is this client's, the
    // statement stays prepared and the session goes on, outside and inside a transaction.
    const divide = (d) => ({ name: 'txpool-divide', text: 'SELECT 10 / $1::int AS q', values: [d] });
    await expectCode(client.query(divide(0)), '22012', `${who}: division by zero`);
    res = await client.query(divide(5));
    if (res.rows[0].q !== 2) {
      throw new Error(`${who}: 10 / 5 = ${res.rows[0].q}`);
    }
    await client.query('BEGIN');
    res = await client.query(named(`failed tx ${r}`));
    const lost = id(res.rows[0].id);
    await expectCode(client.query(divide(0)), '22012', `${who}: division by zero in a transaction`);
    await expectCode(client.query(divide(2)), '25P02', `${who}: a statement in a failed transaction`);
    await client.query('ROLLBACK');
    out.push(`gone ${lost}`);

    // What cannot follow a client between server connections is refused, and the
    // session goes on.
    await expectCode(client.query('LISTEN leaf_channel'), '0A000', `${who}: LISTEN`);
    await expectCode(client.query('SELECT pg_advisory_lock($1)', [r]), '0A000', `${who}: pg_advisory_lock($1)`);
  }
  return out;
}

async function main() {
  const table = ident('TABLE', process.env.TABLE);
  const tag = ident('TAG', process.env.TAG);
  const clients = count('CLIENTS', 50);
  const rounds = count('ROUNDS', 4);
  const all = [];
  for (let i = 0; i < clients; i++) {
    all.push(new Client({ connectionString: process.env.DATABASE_URL }));
  }
  try {
    // Every session open before any work: more clients than the pool has connections.
    await Promise.all(all.map((c) => c.connect()));
    const outs = await Promise.all(all.map((c, n) => work(c, n, table, tag, rounds)));
    for (const lines of outs) {
      process.stdout.write(lines.map((l) => `${l}\n`).join(''));
    }
  } finally {
    await Promise.allSettled(all.map((c) => c.end()));
  }
}

main().catch((err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
