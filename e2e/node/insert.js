// Inserts rows without an ID through leafproxy with node-postgres and prints every ID read
// back, one per line. The proxy fills the key; this script only checks what it got.
//
// Usage: DATABASE_URL=postgres://user@127.0.0.1:6432/db TABLE=client_rows node insert.js
'use strict';

const { Client } = require('pg');

async function main() {
  const table = process.env.TABLE;
  if (!/^[a-z_][a-z0-9_]*$/.test(table || '')) {
    throw new Error(`TABLE must be a plain identifier, got ${JSON.stringify(table)}`);
  }
  const client = new Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  try {
    const ids = [];
    // Simple protocol: a query without parameters.
    const simple = await client.query(`INSERT INTO ${table} (client) VALUES ('node simple') RETURNING id`);
    ids.push(simple.rows[0].id);
    // Extended protocol: a parameterised query, then a named prepared statement reused.
    const extended = await client.query(`INSERT INTO ${table} (client) VALUES ($1) RETURNING id`, ['node extended']);
    ids.push(extended.rows[0].id);
    for (let i = 0; i < 3; i++) {
      const named = await client.query({
        name: 'leaf-insert',
        text: `INSERT INTO ${table} (client) VALUES ($1) RETURNING id`,
        values: [`node prepared ${i}`],
      });
      ids.push(named.rows[0].id);
    }
    const next = await client.query("SELECT leaf_next('order') AS id");
    ids.push(next.rows[0].id);
    for (const id of ids) {
      // int8 arrives as a string: check it is an integer before printing it.
      if (!/^[1-9][0-9]*$/.test(String(id))) {
        throw new Error(`not an ID: ${JSON.stringify(id)}`);
      }
      process.stdout.write(`${id}\n`);
    }
  } finally {
    await client.end();
  }
}

main().catch((err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
