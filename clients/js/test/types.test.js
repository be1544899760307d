import { test } from "node:test";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "..");
const tsc = path.join(root, "node_modules", "typescript", "bin", "tsc");

// ringcast.d.ts describes the surface: a typed usage file (with @ts-expect-error lines
// for calls that must not type-check) compiles under --strict.
test("ringcast.d.ts: the documented usage type-checks", { skip: !existsSync(tsc) && "typescript not installed (npm install)" }, async () => {
  const args = [
    tsc, "--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext",
    "--target", "es2022", "--lib", "es2022,dom", path.join(root, "test-helpers", "types-usage.ts"),
  ];
  await new Promise((resolve, reject) => {
    execFile(process.execPath, args, { cwd: root }, (err, stdout, stderr) => {
      if (err) reject(new Error(`tsc failed:\n${stdout}${stderr}`));
      else resolve();
    });
  });
});
