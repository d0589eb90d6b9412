// The behaviour suite (suite.mjs) under node --test.
import { test } from 'node:test';
import { tests } from './suite.mjs';

for (const { name, fn } of tests) test(name, fn);
