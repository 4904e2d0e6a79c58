// Logs in through leafproxy with node-postgres and prints the current user, or
// "refused SQLSTATE" when the server or the proxy refuses the login.
//
// Usage: DATABASE_URL=postgres://user:password@127.0.0.1:6432/db [SSL_CA=ca.pem] [CHANNEL_BINDING=1] node login.js
'use strict';

const fs = require('fs');
const { Client } = require('pg');

async function main() {
  const config = { connectionString: process.env.DATABASE_URL };
  if (process.env.SSL_CA) {
    config.ssl = { ca: fs.readFileSync(process.env.SSL_CA), servername: 'localhost' };
  }
  if (process.env.CHANNEL_BINDING) {
    // Use SCRAM-SHA-256-PLUS when the server offers it over TLS.
    config.enableChannelBinding = true;
  }
  const client = new Client(config);
  try {
    await client.connect();
  } catch (err) {
    if (err.code) {
      process.stdout.write(`refused ${err.code}\n`);
      return;
    }
    throw err;
  }
  try {
    const res = await client.query('SELECT current_user AS u');
    process.stdout.write(`ok as ${res.rows[0].u}\n`);
  } finally {
    await client.end();
  }
}

main().catch((err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
